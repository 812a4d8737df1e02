"""The static contract check on the source: the #35947 break planted in a copy of the reference backend is
named with its reading line; every assignment form keeps a class quiet and, removed, makes it a break; open
classes are unknowable, not broken; the reference model reports nothing."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import textwrap
import types
from pathlib import Path

import pytest

from harness.case import Batch, Case, Request
from harness.cli import main
from harness.contracts.objects import check_object
from harness.contracts.source import check_class, check_classes
from harness.device import SimDevice
from harness.model import backend as reference_backend
from harness.model.runners import ModelRunner
from harness.targets import Classes, ReferenceTarget
from harness.triage.static import triage_classes

ASSIGNMENT = "        self.token_to_kv_pool = model_runner.token_to_kv_pool\n"


def load(path: Path, module_name: str, text: str) -> types.ModuleType:
    """Import `text` as `module_name` from a real file, so that its source can be read back."""
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def planted(tmp_path):
    """The reference backend's module with `self.token_to_kv_pool = ...` removed from __init__."""
    text = Path(inspect.getsourcefile(reference_backend)).read_text()
    assert text.count(ASSIGNMENT) == 1
    name = "harness.model._planted_backend"
    module = load(tmp_path / "planted_backend.py", name, text.replace(ASSIGNMENT, ""))
    yield module, tmp_path / "planted_backend.py"
    sys.modules.pop(name, None)


def test_the_planted_break_names_the_attribute_the_method_and_the_first_reading_line(planted):
    module, path = planted
    report = check_class(module.DeepseekV4AttnBackend)
    assert report.open == [] and report.hooks == []
    assert [b.attribute for b in report.breaks] == ["token_to_kv_pool"]
    lines = path.read_text().splitlines()
    first_read = next(i for i, line in enumerate(lines, 1) if "self.token_to_kv_pool" in line)
    b = report.breaks[0]
    assert (b.file, b.line) == (str(path), first_read)
    assert b.method == "DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot"
    assert str(b) == (f"DeepseekV4AttnBackend.token_to_kv_pool is never assigned in DeepseekV4AttnBackend or its "
                      f"bases; read by DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot at {path}:{first_read}")


def test_the_reference_model_is_quiet():
    modules = [importlib.import_module(f"harness.model.{m}")
               for m in ("backend", "metadata", "runners", "scheduler", "pools", "enums", "attention")]
    classes = [c for m in modules for c in vars(m).values() if inspect.isclass(c) and c.__module__ == m.__name__]
    assert len(classes) > 10
    reports = check_classes(classes)
    assert [(r.cls, r.breaks, r.open, r.hooks) for r in reports if r.breaks or r.open or r.hooks] == []


def test_triage_checks_the_built_classes_and_reports_static_breaks(planted, tmp_path, monkeypatch, capsys):
    """`python -m harness triage` on a target whose backend class is the planted one: a [static] line."""
    module, path = planted
    runner = type("PlantedModelRunner", (ModelRunner,), {"backend_cls": module.DeepseekV4AttnBackend})
    factory = types.ModuleType("planted_target")
    factory.make = lambda: ReferenceTarget(Classes(model_runner=runner), name="planted")
    monkeypatch.setitem(sys.modules, "planted_target", factory)
    session = factory.make().open(Case(batches=(Batch(requests=(Request(3, 5),)),)), SimDevice())
    assert module.DeepseekV4AttnBackend in triage_classes(session)

    code = main(["triage", "--target", "planted_target:make", "--device", "cpu", "--examples", "1",
                 "--report-dir", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert code == 1
    assert "[static] DeepseekV4AttnBackend.token_to_kv_pool is never assigned" in out and f"{path}:" in out
    report = json.loads((tmp_path / "report" / "triage.json").read_text())
    assert [b["attribute"] for b in report["static_breaks"]] == ["token_to_kv_pool"]

    code = main(["triage", "--target", "planted_target:make", "--static-only", "--report-dir", str(tmp_path / "so")])
    assert code == 1 and "[static] DeepseekV4AttnBackend.token_to_kv_pool" in capsys.readouterr().out
    report = json.loads((tmp_path / "so" / "triage.json").read_text())
    assert report["static_only"] and [b["attribute"] for b in report["static_breaks"]] == ["token_to_kv_pool"]
    assert main(["triage", "--static-only", "--report-dir", str(tmp_path / "clean")]) == 0


# -- every way of creating an attribute: with it the class is quiet, without it `x` is a break ----------------

# form: (class body with a {} slot, what creates `x` there, what stands there in the broken twin)
FORMS = {
    "plain": ("def __init__(self):\n    {}", "self.x = 1", "pass"),
    "annotated": ("def __init__(self):\n    {}", "self.x: int = 1", "pass"),
    "augmented": ("def grow(self):\n    {}", "self.x += 1", "pass"),
    "unpacked": ("def __init__(self):\n    {}", "self.y, (self.x, *self.z) = 1, (2, 3)", "self.y = 1"),
    "for-target": ("def __init__(self):\n    {}", "for self.x in range(3): pass", "pass"),
    "with-target": ("def __init__(self):\n    import contextlib\n    {}",
                    "with contextlib.nullcontext(1) as self.x: pass", "pass"),
    "setattr-literal": ("def __init__(self):\n    {}", "setattr(self, 'x', 1)", "setattr(self, 'w', 1)"),
    "setattr-loop": ("NAMES = {}\ndef __init__(self):\n    for n in self.NAMES: setattr(self, n, 0)",
                     "('w', 'x')", "('w',)"),
    "setattr-private-arg": ("def __init__(self):\n    self._set({})\ndef _set(self, names):\n    for n in names: setattr(self, n, 0)",
                            "('x', 'w')", "('w',)"),
    "dict-item": ("def __init__(self):\n    {}", "self.__dict__['x'] = 1", "self.__dict__['w'] = 1"),
    "class-attribute": ("{}", "x = 1", "pass"),
    "property": ("{}", "@property\ndef x(self): return 1", "pass"),
    "method": ("{}", "def x(self): return 1", "pass"),
    "slots": ("__slots__ = {}", "('x',)", "()"),
    "dataclass-field": ("{}", "x: int = 0", "pass"),
    "new-factory": ("@classmethod\ndef bare(cls):\n    obj = cls.__new__(cls)\n    {}\n    return obj",
                    "obj.x = 1", "pass"),
    "copy-of-self": ("def clone(self):\n    other = copy.copy(self)\n    {}\n    return other",
                     "other.x = 1", "pass"),
    "mangled": ("def __init__(self):\n    {}\ndef get(self): return self.__x", "self.__x = 1", "pass"),
}


def form_module(tmp_path, form: str, present: bool) -> types.ModuleType:
    template, creates, instead = FORMS[form]
    body = template.replace("{}", creates if present else instead)
    reader = "" if form == "mangled" else "def read(self):\n    return self.x\n"
    decorator = "@dataclasses.dataclass\n" if form == "dataclass-field" else ""
    source = f"import copy\nimport dataclasses\n\n\n{decorator}class C:\n" + textwrap.indent(f"{body}\n{reader}", "    ")
    name = f"planted_forms_{form.replace('-', '_')}_{int(present)}"
    return load(tmp_path / f"{name}.py", name, source)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_assignment_form_counts_and_its_absence_is_a_break(tmp_path, form):
    quiet = check_class(form_module(tmp_path, form, True).C)
    assert (quiet.breaks, quiet.open) == ([], []), form
    broken = check_class(form_module(tmp_path, form, False).C)
    expected = "_C__x" if form == "mangled" else "x"
    assert [b.attribute for b in broken.breaks] == [expected] and broken.open == [], form


GETATTR = """
class C:
    def read(self):
        if hasattr(self, "maybe"):
            return self.maybe
        return getattr(self, "optional", None), getattr(self, "x")
"""


def test_getattr_with_a_constant_name_is_a_read_and_a_guarded_read_is_not(tmp_path):
    module = load(tmp_path / "planted_getattr.py", "planted_getattr", GETATTR)
    assert [b.attribute for b in check_class(module.C).breaks] == ["x"]


BASES = '''
class Base:
    def __init__(self):
        self.pool = 1

    def use(self):
        return self.gone


class Child(Base):
    def __init__(self):
        super().__init__()

    def read(self):
        return self.pool


class Overridden(Child):
    def use(self):
        return self.pool


class CallsSuper(Child):
    def use(self):
        return super().use()


class CallsBase(Child):
    def use(self):
        return Base.use(self)
'''


def test_a_base_init_assigns_and_only_reachable_base_methods_are_read(tmp_path):
    """`pool` comes from Base.__init__; Base.use reads the never-assigned `gone`, which an override that
    never calls it hides, and super().use() or Base.use(self) reaches."""
    module = load(tmp_path / "planted_bases.py", "planted_bases", BASES)
    assert [b.attribute for b in check_class(module.Child).breaks] == ["gone"]
    assert check_class(module.Overridden).breaks == []
    for name in ("CallsSuper", "CallsBase"):
        (b,) = check_class(getattr(module, name)).breaks
        assert (b.attribute, b.method) == ("gone", "Base.use")


OPEN = '''
class Getattr:
    def __getattr__(self, name):
        return 0

    def read(self):
        return self.anything


class ComputedSetattr:
    def __init__(self, **kw):
        for key, value in kw.items():
            setattr(self, key, value)

    def read(self):
        return self.anything


class DictUpdate:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def read(self):
        return self.anything
'''


@pytest.mark.parametrize("name,reason", [("Getattr", "Getattr defines __getattr__"),
                                         ("ComputedSetattr", "setattr(self, ...) with a computed attribute name"),
                                         ("DictUpdate", "self.__dict__.update(...)")])
def test_an_open_class_is_unknowable_not_broken(tmp_path, name, reason):
    module = load(tmp_path / "planted_open.py", "planted_open", OPEN)
    report = check_class(getattr(module, name))
    assert report.breaks == []
    assert len(report.open) == 1 and reason in str(report.open[0]) and "planted_open.py:" in str(report.open[0])


HOOKS = '''
class Backend:
    trtllm = False

    def forward(self):
        if self.trtllm:
            return self._forward_trtllm()
        return self.missing


class TrtllmBackend(Backend):
    trtllm = True

    def _forward_trtllm(self):
        return 1
'''


def test_a_method_only_a_subclass_defines_is_a_hook_and_an_instance_attribute_is_still_a_break(tmp_path):
    module = load(tmp_path / "planted_hooks.py", "planted_hooks", HOOKS)
    report = check_class(module.Backend)
    assert [(h.attribute, h.subclass) for h in report.hooks] == [("_forward_trtllm", "TrtllmBackend")]
    assert [b.attribute for b in report.breaks] == ["missing"]


BYPASSED = '''
class Backend:
    def __init__(self, pool):
        self.token_to_kv_pool = pool
        self.device = "cpu"

    def snapshot(self):
        return self.token_to_kv_pool, self.device


def bare():
    """As SGLang's unit tests build it: __init__ bypassed, some attributes set by hand."""
    obj = Backend.__new__(Backend)
    obj.device = "cpu"
    return obj
'''


def test_a_bypassed_init_is_the_dynamic_form_the_source_is_sound(tmp_path):
    """The class assigns everything in __init__ (static: quiet); the object built without it lacks one
    attribute (dynamic: the built-object check names it)."""
    module = load(tmp_path / "planted_bypassed.py", "planted_bypassed", BYPASSED)
    assert check_class(module.Backend).breaks == []
    assert [b.attribute for b in check_object(module.bare(), ["snapshot"])] == ["token_to_kv_pool"]
