"""Bad input gets one error type naming the field and the allowed values."""

from __future__ import annotations

import pytest

from harness.case import Batch, Case, Dims, Mutation, Request
from harness.errors import InvalidArgument
from harness.model.enums import ForwardMode


def test_json_round_trip():
    case = Case(batches=(Batch(mode=ForwardMode.MIXED, requests=(Request(3, 4), Request(1, 1)), graph=True,
                               mutations=(Mutation("swa_clear", count=2, poison=True),)),))
    assert Case.from_json(case.to_json()) == case


@pytest.mark.parametrize("text,needle", [
    ('{"semantics": "v9"}', "pr, 0.5.23"),
    ('{"spec": "MEDUSA"}', "EAGLE"),
    ('{"batches": [{"mode": "PREFILL"}]}', "EXTEND"),
    ('{"batches": [{"requests": [{"prefix_len": 0, "extend_len": 0}]}]}', "extend_len"),
    ('{"batches": [{"mutations": [{"kind": "flip"}]}]}', "swa_clear"),
    ('{"dims": {"layer_ratios": [3]}}', "0, 4, 128"),
    ('{"dims": {"heads": 0}}', "dims.heads"),
    ('{"colour": 1}', "unknown field"),
    ("not json", "not valid JSON"),
    ('{"graph_contract": "full"}', "fresh, bcg"),
    # a field of the wrong type is named with what it must be, never read as something else
    ('{"batches": [{"requests": "abc"}]}', r"case.batches\[0\].requests='abc': expected a list"),
    ('{"batches": [{"requests": [[1, 2]]}]}', r"requests\[0\]=\[1, 2\]: expected an object with the fields"),
    ('{"batches": [{"requests": [{"prefix_len": 1, "extend_len": "x"}]}]}', r"extend_len='x': expected an integer"),
    ('{"flags": {"cp_active": 1}}', "case.flags.cp_active=1: expected true or false"),
    ('{"delay_cycles": true}', "case.delay_cycles=True: expected an integer"),
    ('{"spec": 3}', "case.spec=3: expected the algorithm's name"),
    ('{"batches": [{"mode": 1}]}', r"case.batches\[0\].mode=1 is not one of: EXTEND"),
    ('{"batches": [{"requests": [{"prefix_len": 1}]}]}', "missing 1 required positional argument: 'extend_len'"),
    # once a default case that passed
    ("{}", "case: the field batches is missing"),
    ('{"semantics": "pr"}', "case: the field batches is missing"),
    # once an overflow deep in the run, or a replay of minutes: each limit named, with all of them
    ('{"batches": [{}], "data_seed": 1180591620717411303424}', r"data_seed: 1,180,591,620,717,411,303,424 is over "
                                                               r"the limit of 4,294,967,295 \(the harness's limits: "),
    ('{"batches": [{}], "data_seed": -1}', "data_seed=-1: must be >= 0"),
    ('{"batches": [{}], "delay_cycles": 1180591620717411303424}', "delay_cycles: .* is over the limit of"),
    ('{"batches": [{"requests": [' + ", ".join(['{"prefix_len": 0, "extend_len": 1}'] * 100_000) + ']}]}',
     r"batches\[0\].requests: 100,000 requests is over the limit of 256 requests"),
    ('{"batches": [{"requests": [{"prefix_len": 0, "extend_len": 60000}]}]}',
     r"batches\[0\]: tokens \(the extend_len of its requests together\): 60,000 is over the limit of 32,768"),
    ('{"batches": [{}], "dims": {"heads": 100000}}', "dims.heads: 100,000 is over the limit of 128"),
    ('{"batches": [{}], "dims": {"page_size": 1000000000}}', "dims.page_size: 1,000,000,000 is over the limit of 4,096"),
    ('{"batches": [' + ", ".join(["{}"] * 17) + ']}', "batches: 17 batches is over the limit of 16 batches"),
])
def test_bad_case_is_named(text, needle):
    with pytest.raises(InvalidArgument, match=needle):
        Case.from_json(text)


def test_mtp_is_an_alias_of_nextn():
    assert Case.from_json('{"spec": "MTP", "batches": [{}]}').spec.name == "NEXTN"


def test_impossible_geometry():
    with pytest.raises(InvalidArgument, match="IDLE batch has no requests"):
        Case(batches=(Batch(mode=ForwardMode.IDLE, requests=(Request(0, 1),)),)).validate()
    with pytest.raises(InvalidArgument, match="dims.page_size"):
        Case(dims=Dims(page_size=0)).validate()
    with pytest.raises(InvalidArgument, match="dims.kv_format='bf16' is not one of: float32, fp8_v4"):
        Case(dims=Dims(kv_format="bf16")).validate()
    with pytest.raises(InvalidArgument, match="'fp8_v4' needs head_dim 512"):
        Case(dims=Dims(kv_format="fp8_v4")).validate()


def test_a_decode_batch_of_several_tokens_a_request_is_refused():
    """No SGLang decode step adds more than one token a request: such a case is bad input, named by its field."""
    case = Case(batches=(Batch(), Batch(mode=ForwardMode.DECODE, requests=(Request(4, 1), Request(3, 2)))))
    with pytest.raises(InvalidArgument, match=r"batches\[1\]\.requests\[1\]: extend_len=2 in a DECODE batch; allowed: 1"):
        case.validate()
