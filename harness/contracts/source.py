"""Static interface contracts: attributes a class reads as `self.X` but never assigns, found on the source.

The source-side half of triage (`harness.contracts.objects.check_object` checks an object as built). For a class, the
methods its MRO resolves (and what they reach through `super()` or `Base.method(self, ...)`) are read from
the source; every `self.X` they load must be created somewhere in the class or a base: `self.X = ...`
(annotated, augmented, unpacked, `for self.X in`, `with ... as self.X`), `setattr` or `__dict__[...]` with
a name the source spells out (a literal, a constant, a loop over constants, a private method's argument),
attributes of a `cls.__new__(cls)` or a copy of self built inside the class, class attributes, methods,
properties, `__slots__`, dataclass (pydantic, msgspec, attrs, NamedTuple) fields. An attribute none of
these creates is a break: class, attribute, reading method, file:line. That is how the #35947 CI break
(`token_to_kv_pool` missing) looks on the source once `self.token_to_kv_pool = ...` is gone.

Not breaks, and said so:
- an *open* class, one that can create attributes the source does not name (`__getattr__`, setattr with a
  computed name, `self.__dict__.update`, a base whose `__init__` has no source): its attributes are
  unknowable statically, and the report says why and where;
- a *subclass hook*: a method or class attribute the class reads but only its subclasses define (DSV4's
  `_forward_trtllm`, provided by the TRT-LLM backend). Subclasses are those loaded, and those declared in
  the modules beside the class's own.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import linecache
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.contracts.objects import short_path


@dataclass(frozen=True)
class StaticBreak:
    cls: str
    attribute: str
    method: str
    file: str
    line: int

    def __str__(self) -> str:
        return (f"{self.cls}.{self.attribute} is never assigned in {self.cls} or its bases; read by "
                f"{self.method} at {self.file}:{self.line}")


@dataclass(frozen=True)
class OpenClass:
    cls: str
    reason: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.cls}: attributes unknowable statically ({self.reason} at {self.file}:{self.line})"


@dataclass(frozen=True)
class SubclassHook:
    cls: str
    attribute: str
    subclass: str
    method: str
    file: str
    line: int

    def __str__(self) -> str:
        return (f"{self.cls}.{self.attribute} is defined only by its subclass {self.subclass}; read by "
                f"{self.method} at {self.file}:{self.line}")


@dataclass
class StaticReport:
    cls: str
    breaks: list[StaticBreak] = field(default_factory=list)
    open: list[OpenClass] = field(default_factory=list)
    hooks: list[SubclassHook] = field(default_factory=list)


# -- source access ---------------------------------------------------------------------------------------

_TREES: dict[str, tuple[str, ast.Module | None]] = {}


def _module_tree(file: str) -> ast.Module | None:
    """One parse per file version (inspect re-parses the whole module for every class it is asked about)."""
    linecache.checkcache(file)
    text = "".join(linecache.getlines(file))
    if file not in _TREES or _TREES[file][0] != text:
        try:
            tree = ast.parse(text) if text else None
        except (SyntaxError, ValueError):
            tree = None
        _TREES[file] = (text, tree)
    return _TREES[file][1]


@functools.lru_cache(maxsize=256)
def _class_nodes(tree: ast.Module) -> dict[str, list[ast.ClassDef]]:
    """Every class definition by its qualified name (`f.<locals>.C` for one defined in a function)."""
    out: dict[str, list[ast.ClassDef]] = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                out.setdefault(prefix + child.name, []).append(child)
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{prefix}{child.name}.<locals>.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _class_node(klass: type) -> tuple[ast.ClassDef, str] | None:
    try:
        file = inspect.getsourcefile(klass)
    except TypeError:  # a builtin or C type
        return None
    tree = _module_tree(file) if file else None
    if tree is None:
        return None
    nodes = _class_nodes(tree).get(klass.__qualname__)
    if not nodes:
        return None
    first = getattr(klass, "__firstlineno__", None)  # Python >= 3.13 records it
    node = next((n for n in nodes if n.lineno == first), nodes[-1])
    return node, file


def _unwrap(value) -> list:
    """The Python functions behind a class attribute: a method, a static/class method, a property's."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, functools.cached_property):
        value = value.func
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if inspect.isfunction(f)]
    return [value] if inspect.isfunction(value) else []


def _function_node(func) -> tuple[ast.FunctionDef, str] | None:
    """The definition of a function (by file, name and first line), for methods of classes made by type()."""
    try:
        file = inspect.getsourcefile(func)
    except TypeError:
        return None
    tree = _module_tree(file) if file else None
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func.__name__:
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            if first == func.__code__.co_firstlineno:
                return node, file
    return None


def _functions(node: ast.ClassDef):
    return [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _self_name(func) -> str | None:
    """The instance parameter's name, or None for static and class methods."""
    names = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", None) for d in func.decorator_list}
    if names & {"staticmethod", "classmethod"}:
        return None
    params = func.args.posonlyargs + func.args.args
    return params[0].arg if params else None


def _mangle(attr: str, klass: type) -> str:
    if attr.startswith("__") and not attr.endswith("__"):
        return f"_{klass.__name__.lstrip('_')}{attr}"
    return attr


def _walk(func, self_name: str):
    """The nodes of `func` where `self_name` still means the instance (not rebound by a nested def/lambda)."""
    stack = list(func.body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = child.args
                if any(a.arg == self_name for a in args.posonlyargs + args.args + args.kwonlyargs):
                    continue
                stack.extend(d for d in args.defaults + args.kw_defaults if d is not None)
                stack.extend(child.body if isinstance(child.body, list) else [child.body])
                continue
            stack.append(child)


def _is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _call_name(node: ast.Call) -> str | None:
    return getattr(node.func, "id", None) or getattr(node.func, "attr", None)


def _const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _field_names(cls: type) -> set[str]:
    """Fields a generated __init__ assigns: dataclasses, pydantic, msgspec, attrs, NamedTuple."""
    names = set(getattr(cls, "__dataclass_fields__", {}) or {})
    for attr in ("model_fields", "__struct_fields__", "_fields"):
        value = inspect.getattr_static(cls, attr, None)
        if isinstance(value, (dict, tuple, list)):
            names |= set(value)
    names |= {a.name for a in getattr(cls, "__attrs_attrs__", ()) or ()}
    return names


# -- the analysed class: its methods by defining class ------------------------------------------------------

@dataclass
class _Method:
    klass: type
    node: ast.FunctionDef
    file: str


class _Index:
    """The source of every class in the MRO that has one, and the calls each private method receives."""

    def __init__(self, cls: type):
        self.cls = cls
        self.methods: dict[tuple[type, str], list[_Method]] = {}
        self.without_source: list[tuple[type, str]] = []  # Python functions whose source cannot be read
        for klass in cls.__mro__[:-1]:  # object has neither source nor instance attributes
            found = _class_node(klass)
            if found is not None:
                node, file = found
                for func in _functions(node):
                    self.methods.setdefault((klass, func.name), []).append(_Method(klass, func, file))
                continue
            for name, value in vars(klass).items():  # made by type(...): its functions may have source
                for func in _unwrap(value):
                    node_file = _function_node(func)
                    if node_file is None:
                        self.without_source.append((klass, name))
                    else:
                        self.methods.setdefault((klass, name), []).append(_Method(klass, *node_file))

    @functools.cached_property
    def _self_calls(self) -> dict[str, list[tuple[ast.Call, _Method]]]:
        out: dict[str, list[tuple[ast.Call, _Method]]] = {}
        for methods in self.methods.values():
            for m in methods:
                me = _self_name(m.node)
                for node in ast.walk(m.node):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                            and _is_name(node.func.value, me):
                        out.setdefault(node.func.attr, []).append((node, m))
        return out

    def calls_to(self, name: str) -> list[tuple[ast.Call, _Method]]:
        """(call, calling method) for every `self.<name>(...)` in the class's methods."""
        return self._self_calls.get(name, [])


class _NameResolver:
    """The attribute names an expression spells out: literals, class and module constants, a loop over
    them, a local bound to them, `f.name` over `fields(...)`, and a private method's parameter (what the
    class's own calls pass)."""

    def __init__(self, method: _Method, index: _Index, depth: int = 0):
        self.method, self.index, self.depth = method, index, depth
        klass = method.klass
        self.klass = klass
        self.module = vars(sys.modules[klass.__module__]) if klass.__module__ in sys.modules else {}
        self.local: dict[str, ast.AST] = {}
        self.loops: dict[str, ast.AST] = {}
        for node in ast.walk(method.node):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.local[node.targets[0].id] = node.value
            elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
                self.loops[node.target.id] = node.iter
        args = method.node.args
        self.params = [a.arg for a in args.posonlyargs + args.args]
        self.kwonly = {a.arg for a in args.kwonlyargs}

    def names(self, node, depth: int = 0) -> set[str] | None:
        if depth > 8:
            return None
        if (text := _const_str(node)) is not None:
            return {text}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return self._union(node.elts, depth)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.BitOr)):
            return self._union([node.left, node.right], depth)
        if isinstance(node, ast.Name):
            if node.id in self.loops:
                return self.names(self.loops[node.id], depth + 1)
            if node.id in self.local:
                return self.names(self.local[node.id], depth + 1)
            if node.id in self.params[1:] or node.id in self.kwonly:
                return self._argument(node.id)
            return self._value(self.module.get(node.id))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in ("self", "cls", self.klass.__name__):
                return self._value(inspect.getattr_static(self.klass, node.attr, None))
            loop = self.loops.get(node.value.id)
            if node.attr == "name" and isinstance(loop, ast.Call) and _call_name(loop) == "fields":
                return _field_names(self.klass)  # `for f in fields(...): setattr(self, f.name, ...)`
        return None

    def _argument(self, param: str) -> set[str] | None:
        """A private method's parameter: the union of what every call in the class passes for it."""
        name = self.method.node.name
        if not name.startswith("_") or name.startswith("__") or self.depth > 3:
            return None
        position = self.params.index(param) - 1 if param in self.params else None
        out: set[str] = set()
        calls = self.index.calls_to(name)
        for call, caller in calls:
            given = next((k.value for k in call.keywords if k.arg == param), None)
            if given is None and position is not None and position < len(call.args):
                given = call.args[position]
            if given is None or any(isinstance(a, ast.Starred) for a in call.args):
                return None
            got = _NameResolver(caller, self.index, self.depth + 1).names(given)
            if got is None:
                return None
            out |= got
        return out if calls else None

    def _union(self, nodes, depth) -> set[str] | None:
        out: set[str] = set()
        for item in nodes:
            got = self.names(item, depth + 1)
            if got is None:
                return None
            out |= got
        return out

    @staticmethod
    def _value(value) -> set[str] | None:
        if isinstance(value, (tuple, list, set, frozenset)) and all(isinstance(v, str) for v in value):
            return set(value)
        return None


# -- what one method assigns, reads and calls on self --------------------------------------------------------

@dataclass
class _Facts:
    assigned: set[str] = field(default_factory=set)
    reads: list[tuple[str, int]] = field(default_factory=list)
    guarded: set[str] = field(default_factory=set)  # hasattr(self, "X") / getattr(self, "X", default)
    open_reasons: list[tuple[str, int]] = field(default_factory=list)
    super_calls: set[str] = field(default_factory=set)
    explicit_calls: list[tuple[str, str]] = field(default_factory=list)  # Base.method(self, ...)


def _facts(method: _Method, index: _Index) -> _Facts:
    facts = _Facts()
    func, klass = method.node, method.klass
    me = _self_name(func)
    params = func.args.posonlyargs + func.args.args
    instances = ({me} if me else set()) | _new_instances(func, params[0].arg if params else "cls", klass)
    if not instances:
        return facts
    me = me or "\0"  # a class or static method reads nothing through self, but may build an instance
    resolver = _NameResolver(method, index)

    def assign_target(target):
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in instances:
            facts.assigned.add(_mangle(target.attr, klass))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                assign_target(elt)
        elif isinstance(target, ast.Starred):
            assign_target(target.value)
        elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
              and target.value.attr == "__dict__" and isinstance(target.value.value, ast.Name)
              and target.value.value.id in instances):
            named(target.slice, target.lineno, f"{target.value.value.id}.__dict__[...] = ...")

    def named(name_node, line, what):
        names = resolver.names(name_node)
        if names is None:
            facts.open_reasons.append((f"{what} with a computed attribute name", line))
        else:
            facts.assigned |= {_mangle(n, klass) for n in names}

    for node in _walk(func, me):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                assign_target(target)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension)):
            assign_target(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            assign_target(node.optional_vars)
        elif isinstance(node, ast.Attribute) and _is_name(node.value, me) and isinstance(node.ctx, ast.Load):
            facts.reads.append((_mangle(node.attr, klass), node.lineno))
        elif isinstance(node, ast.Call):
            _call(node, me, instances, facts, named, klass)
    return facts


def _new_instances(func, me: str, klass: type) -> set[str]:
    """Locals bound to an instance of the class made without __init__ (`cls.__new__(cls)`), or to a copy of self."""
    own = {"cls", me, f"type({me})", f"{me}.__class__", klass.__name__}
    out = set()
    for node in ast.walk(func):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and node.value.args):
            continue
        call, first = node.value, ast.unparse(node.value.args[0])
        name = _call_name(call)
        if (name == "__new__" and first in own) or (name in ("copy", "deepcopy") and first == me):
            out.add(node.targets[0].id)
    return out


def _call(node: ast.Call, me: str, instances: set[str], facts: _Facts, named, klass: type) -> None:
    func, args = node.func, node.args
    fname = _call_name(node)
    if fname in ("setattr", "__setattr__") and len(args) >= 2 and isinstance(args[0], ast.Name) \
            and args[0].id in instances:
        named(args[1], node.lineno, f"{fname}({args[0].id}, ...)")
    elif fname in ("hasattr", "getattr") and len(args) >= 2 and _is_name(args[0], me) and _const_str(args[1]):
        name = _const_str(args[1])  # no mangling: getattr's name is taken as written
        if fname == "getattr" and len(args) == 2:
            facts.reads.append((name, node.lineno))  # getattr(self, "X") reads X as self.X does
        else:
            facts.guarded.add(name)
    elif fname in ("update", "setdefault") and isinstance(func, ast.Attribute) and _is_instance_dict(func.value, instances):
        facts.open_reasons.append((f"{ast.unparse(func)}(...)", node.lineno))
    if isinstance(func, ast.Attribute):
        receiver = func.value
        if isinstance(receiver, ast.Call) and _is_name(receiver.func, "super"):
            facts.super_calls.add(func.attr)
        elif isinstance(receiver, ast.Name) and receiver.id != me and args and _is_name(args[0], me):
            facts.explicit_calls.append((receiver.id, func.attr))


def _is_instance_dict(node, instances) -> bool:
    """`self.__dict__` or `vars(self)`."""
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        return isinstance(node.value, ast.Name) and node.value.id in instances
    return (isinstance(node, ast.Call) and _is_name(node.func, "vars") and len(node.args) == 1
            and isinstance(node.args[0], ast.Name) and node.args[0].id in instances)


# -- the class check ---------------------------------------------------------------------------------------

def _in_packages(klass: type, packages: tuple[str, ...]) -> bool:
    return any(klass.__module__ == p or klass.__module__.startswith(p + ".") for p in packages)


def _owner(cls: type, name: str, after: type | None = None) -> type | None:
    mro = cls.__mro__
    if after is not None:
        mro = mro[mro.index(after) + 1:]
    return next((k for k in mro if name in vars(k)), None)


def check_class(cls: type, packages: Iterable[str] | None = None) -> StaticReport:
    """What `cls` reads as `self.X` in the methods of it and its bases in `packages` (default: its top-level
    package) and never creates. Bases outside `packages` contribute what they assign, not what they read."""
    packages = tuple(packages) if packages else (cls.__module__.split(".")[0],)
    report = StaticReport(cls.__name__)
    index = _Index(cls)
    for klass in cls.__mro__[:-1]:
        for hook in ("__getattr__", "__getattribute__"):  # C types' slot wrappers are plain lookups
            if inspect.isfunction(vars(klass).get(hook)):
                file, line = _where(vars(klass)[hook])
                report.open.append(OpenClass(cls.__name__, f"{klass.__qualname__} defines {hook}", file, line))
    for klass, name in index.without_source:
        if not _field_names(klass):  # a dataclass's generated methods have no source and assign only fields
            report.open.append(OpenClass(cls.__name__, f"{klass.__qualname__}.{name} has no readable source",
                                         *_where(klass)))

    facts = {key: [_facts(m, index) for m in methods] for key, methods in index.methods.items()}
    assigned: set[str] = set(dir(cls)).union(*map(vars, cls.__mro__)) | _field_names(cls)  # Enum's dir() hides methods
    for (klass, name), per_def in facts.items():
        file = index.methods[(klass, name)][0].file
        for f in per_def:
            assigned |= f.assigned
            report.open += [OpenClass(cls.__name__, f"{klass.__qualname__}.{name}: {reason}", short_path(file), line)
                            for reason, line in f.open_reasons]
    if report.open:
        return report

    seen: set[str] = set()
    for klass, name in _reached(cls, index, facts):
        if not _in_packages(klass, packages):
            continue
        file = short_path(index.methods[(klass, name)][0].file)
        for f in facts[(klass, name)]:
            for attr, line in sorted(f.reads, key=lambda r: r[1]):
                if attr in assigned or attr in f.guarded or attr in seen:
                    continue
                seen.add(attr)
                provider = _subclass_defining(klass, attr)
                if provider is not None:
                    report.hooks.append(SubclassHook(cls.__name__, attr, provider, f"{klass.__qualname__}.{name}",
                                                     file, line))
                else:
                    report.breaks.append(StaticBreak(cls.__name__, attr, f"{klass.__qualname__}.{name}", file, line))
    return report


def _reached(cls: type, index: _Index, facts) -> list[tuple[type, str]]:
    """The (defining class, method) pairs an instance of `cls` can run: what the MRO resolves, then what
    those reach through super() and explicit `Base.method(self, ...)` calls; the class itself first, then
    by line, so a break names the first line that reads the attribute."""
    order = {k: i for i, k in enumerate(cls.__mro__)}
    todo = [(k, name) for (k, name) in facts if _owner(cls, name) is k]
    reached: set[tuple[type, str]] = set()
    while todo:
        klass, name = todo.pop()
        if (klass, name) in reached:
            continue
        reached.add((klass, name))
        module = vars(sys.modules.get(klass.__module__, builtins))
        for f in facts[(klass, name)]:
            targets = [(_owner(cls, callee, after=klass), callee) for callee in f.super_calls]
            for base_name, callee in f.explicit_calls:
                base = module.get(base_name)
                if isinstance(base, type) and base in order:
                    targets.append((_owner(base, callee), callee))
            todo += [t for t in targets if t in facts]
    return sorted(reached, key=lambda kn: (order[kn[0]], index.methods[kn][0].node.lineno))


def _subclass_defining(cls: type, attr: str) -> str | None:
    """A subclass of `cls` (the class whose method reads `attr`) that defines `attr` at class level: one
    loaded, or one declared in the modules beside `cls`'s."""
    stack = list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        if attr in vars(sub):
            return sub.__qualname__
        stack += sub.__subclasses__()
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    return _declared_subclasses(str(Path(file).parent), cls.__name__).get(attr) if file else None


@functools.lru_cache(maxsize=32)
def _declared_subclasses(folder: str, base: str) -> dict[str, str]:
    """Class-level names defined by the (transitive) subclasses of `base` declared in `folder`'s modules.
    Only modules that mention a base by name are parsed."""
    texts = {}
    for path in sorted(Path(folder).glob("*.py")):
        try:
            texts[str(path)] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    bases, found, parsed = {base}, {}, set()
    grew = True
    while grew:
        grew = False
        for file, text in texts.items():
            if file in parsed or not any(b in text for b in bases):
                continue
            parsed.add(file)
            tree = _module_tree(file)
            for node in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)) if tree else ():
                if node.name in bases or not {ast.unparse(b).split(".")[-1] for b in node.bases} & bases:
                    continue
                bases.add(node.name)
                parsed.clear()  # a new base name: modules already read may subclass it
                grew = True
                for stmt in node.body:
                    for name in _class_level_names(stmt):
                        found.setdefault(name, node.name)
    return found


def _class_level_names(stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _where(obj) -> tuple[str, int]:
    try:
        return short_path(inspect.getsourcefile(obj) or "?"), inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return "?", 0


def check_classes(classes: Iterable[type], packages: Iterable[str] | None = None) -> list[StaticReport]:
    return [check_class(c, packages) for c in classes]


# -- the section triage writes -----------------------------------------------------------------------------

def module_classes(modules) -> list[type]:
    """The classes each module defines itself (not those it imports)."""
    return [obj for m in modules for obj in vars(m).values() if inspect.isclass(obj) and obj.__module__ == m.__name__]


def static_section(reports: list[StaticReport]) -> dict:
    """The static part of triage.json; each break and each open class is printed as it is reported."""
    breaks = [b for r in reports for b in r.breaks]
    unknowable = [o for r in reports for o in r.open]
    for b in breaks:
        print(f"[static] {b}")
    for o in unknowable:
        print(f"[static/unknowable] {o}")
    return {"static_breaks": [asdict(b) for b in breaks], "static_unknowable": [asdict(o) for o in unknowable],
            "static_subclass_hooks": [asdict(h) for r in reports for h in r.hooks],
            "static_classes": [r.cls for r in reports]}
