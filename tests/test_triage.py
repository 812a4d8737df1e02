"""Interface contracts on built objects: the CI break after PR #35947, reproduced and reported."""

from __future__ import annotations

from harness.case import Batch, Case, Request
from harness.contracts.objects import check_object, reads_on_every_call
from harness.device import SimDevice
from harness.model.backend import DeepseekV4AttnBackend
from harness.mutants.corpus import mutant_target
from harness.targets import ReferenceTarget


def built_backend(target):
    session = target.open(Case(batches=(Batch(requests=(Request(3, 5),)),)), SimDevice())
    return session.model_runner.attn_backend


def test_the_backend_as_built_meets_its_contract():
    assert check_object(built_backend(ReferenceTarget())) == []


def test_a_backend_built_without_init_names_the_attribute_and_the_reading_line():
    """As SGLang's unit tests build it: object.__new__, then only some attributes set (#36639)."""
    complete = built_backend(ReferenceTarget())
    bare = object.__new__(DeepseekV4AttnBackend)
    for name, value in vars(complete).items():
        if name != "token_to_kv_pool":
            setattr(bare, name, value)
    breaks = check_object(bare)
    assert [b.attribute for b in breaks] == ["token_to_kv_pool"]
    text = str(breaks[0])
    assert "DeepseekV4AttnBackend.token_to_kv_pool" in text and "harness/model/backend.py:" in text
    assert "read by prepare_prefill_shared_read_snapshot" in text  # the first statement of the PR-era hook


def test_the_seeded_missing_attribute_mutant_is_reported():
    assert [b.attribute for b in check_object(built_backend(mutant_target("missing_token_to_kv_pool")))] == \
        ["token_to_kv_pool"]


class _Backend:
    switch = True  # a class attribute: every object has it

    def hook(self, batch):
        first = self.first or self.second  # `first` on every call, `second` only when `first` is falsy
        if self.pool.window is not None:  # read on every call
            return None
        if batch:
            self.late()  # past an early return: on some calls only
        return first

    def late(self):
        return self.late_attr

    def entry(self):
        self.helper()
        return self.switch

    def helper(self):
        return self.always


def test_every_call_reads_are_what_an_object_built_without_init_must_carry():
    assert [(r.attribute, r.call_path) for r in reads_on_every_call(_Backend, "hook")] == [
        ("first", ("hook",)), ("pool", ("hook",))]  # the early return ends the every-call part
    assert [(r.attribute, r.call_path) for r in reads_on_every_call(_Backend, "entry")] == [
        ("always", ("entry", "helper"))]
