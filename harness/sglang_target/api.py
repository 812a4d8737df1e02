"""Import the installed SGLang package and collect the real objects the sglang target drives.

Everything the target calls is looked up here, once, by its SGLang name; whatever is missing is
reported in one `EnvironmentBroken` naming each missing module or attribute (the CLI exits 3).

On a CUDA host SGLang's modules take their CUDA branches at import, which import its compiled extension
`sgl_kernel` (package sglang-kernel, built for one torch). Where that extension cannot be loaded (not
installed, or built for another torch), and only then, it is stood in by a recording module
(`StandIns`): every attribute is a recorder, and a call of one raises `StandInUsed` (exit 3, BROKEN),
naming the function and the calling line, and stays recorded so that a caller that swallows the error
does not hide it. CUDA is never hidden during the import. The stood-in modules are listed in
`summary.json` and on the page. On the CPU nothing is stood in: SGLang's CPU branches do not import it.

SGLang's Triton metadata kernels (`build_swa_token_ids`, `combine_topk_swa_indices`) run either
interpreted, on the CPU simulator's tensors, or compiled, on CUDA tensors. Triton fixes that choice for
the whole process when it is first imported (`TRITON_INTERPRET`), so `prepare_triton` makes it then:
interpreted unless a CUDA device is visible or `TRITON_INTERPRET` says otherwise. A session on the
other kind of device is refused with the setting that would fix it.

The module is public: besides the target, `triage --versions` (the backend's module name) and the
sanitizer's SGLang cases (the Triton kernels' module and `prepare_triton`) read it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import traceback
import types
import warnings
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Any

from harness.case import GRAPH_CONTRACTS
from harness.device import DeviceKind, memcheck
from harness.errors import EnvironmentBroken
from harness.semantics import Semantics
from harness.sglang_target.generations import (BACKEND, BASE_BACKEND, BREAKABLE_BACKEND, BUFFER_REGISTRY, GENERATIONS,
                                               GRAPH_CONFIG, GRAPH_RUNNER, INPUT_BUFFERS, KERNELS, KV_TRANSLATOR,
                                               MODEL, SHAPE_KEY, SPARSE_UTILS, SPEC, TC_CONTEXT,
                                               Generation, recognise)
from harness.sglang_target.server import DSV4_ARCHITECTURES

TRITON_KERNELS = ("_build_swa_token_ids_kernel", "_combine_topk_swa_indices_kernel")  # SGLang's own, in KERNELS
DEQUANT = "sglang.kernels.ops.attention.dsv4.dequant_k_cache"  # the V4 cache's Triton dequantizer (0.5.23)
PUBLISHER = "sglang.srt.model_executor.runner_utils.shared_read_event"
ENVIRON = "sglang.srt.environ"
RUNTIME = "sglang.srt.runtime_context"
FORWARD = "sglang.srt.model_executor.forward_batch_info"
CP_BASE = "sglang.srt.layers.cp.base"
CP_INTERLEAVE = "sglang.srt.layers.cp.interleave"  # the CP layout of a release that runs CP (`Generation.runs_cp`)
CP_UTILS = "sglang.srt.layers.cp.utils"
BUCKETS = "sglang.srt.arg_groups.cuda_graph_hook"
BASE_GRAPH_RUNNER = "sglang.srt.model_executor.runner.base_cuda_graph_runner"
BASE_RUNNER = "sglang.srt.model_executor.runner.base_runner"
SCHEDULER = "sglang.srt.managers.scheduler"
TP_WORKER = "sglang.srt.managers.tp_worker"
SPEC_WORKER = "sglang.srt.speculative.base_spec_worker"
EAGLE_WORKER = "sglang.srt.speculative.eagle_worker_v2"
DRAFT_GRAPH_RUNNER = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"
EAGLE_INFO = "sglang.srt.speculative.eagle_info"
EAGER_RUNNER = "sglang.srt.model_executor.runner.eager_runner"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
FORWARD_CONTEXT = "sglang.srt.model_executor.forward_context"
LOGITS = "sglang.srt.layers.logits_processor"
SERVER_ARGS = "sglang.srt.server_args"
SPEC_HOOK = "sglang.srt.arg_groups.speculative_hook"
MODEL_CONFIG = "sglang.srt.configs.model_config"

# (module, dotted attribute) every generation needs; each generation's own names are in `generations`.
_COMMON = [
    (BACKEND, "DeepseekV4AttnBackend"), (BACKEND, "DeepseekV4AttnBackend._build_sparse_prefill_chunk_cache"),
    (BACKEND, "DeepseekV4AttnBackend.shared_read_ends"), (BACKEND, "DeepseekV4AttnBackend.get_swa_out_cache_loc"),
    (BACKEND, "DSV4Metadata"), (BACKEND, "SWA_WINDOW"),
    (BASE_BACKEND, "SharedReadEnds"),
    (SPARSE_UTILS, "SparsePrefillChunkCache.build"), (SPARSE_UTILS, "SparsePrefillChunkCache.ensure_c128"),
    *((KERNELS, name) for name in TRITON_KERNELS),
    (PUBLISHER, "maybe_publish_prefill_shared_read_done"),
    (SPEC, "SpeculativeAlgorithm"), (SPEC, "SpeculativeAlgorithm.is_dflash_family"),
    (ENVIRON, "envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE"), (ENVIRON, "envs.SGLANG_FORCE_COARSE_WAR_BARRIER"),
    (ENVIRON, "envs.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"),
    (RUNTIME, "get_context"), (RUNTIME, "get_memory"), (RUNTIME, "_ConfigBag"),
    (FORWARD, "ForwardMode"), (CP_BASE, "get_cp_strategy"), (CP_BASE, "_STRATEGY"),
    (BUCKETS, "generate_prefill_cuda_graph_batch_sizes"),
    (GRAPH_RUNNER, "_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR"),
    (BASE_GRAPH_RUNNER, "BaseCudaGraphRunner._pad_to_bucket"),
    (SCHEDULER, "Scheduler._apply_war_barrier"), (SCHEDULER, "Scheduler.run_event_loop"),
    (SCHEDULER, "Scheduler.event_loop_overlap"), (SCHEDULER, "Scheduler.is_disable_overlap_for_batch"),
    (SCHEDULER, "DisaggregationMode"), (SCHEDULER, "is_cuda"),
    (EAGER_RUNNER, "EagerRunner.execute"), (EAGER_RUNNER, "EagerRunner.load_batch"),
    (MODEL_RUNNER, "ModelRunner._extend_forward_kwargs"), (MODEL_RUNNER, "ModelRunner._pp_kwargs"),
    (BUFFER_REGISTRY, "build_eager_registry"), (FORWARD, "ForwardBatch"),
    (RUNTIME, "get_parallel"), (FORWARD_CONTEXT, "ForwardContext"), (FORWARD_CONTEXT, "forward_context"),
    (FORWARD, "CaptureHiddenMode"), (LOGITS, "LogitsProcessorOutput"), (KV_TRANSLATOR, "KVIndexTranslator"),
    (MODEL_RUNNER, "ModelRunner.prepare_dummy_forward_batch"),
    (TP_WORKER, "BaseTpWorker.last_shared_read_runner"), (SPEC_WORKER, "BaseSpecWorker.last_shared_read_runner"),
    (EAGLE_WORKER, "EAGLEWorkerV2.last_shared_read_runner"),
    (DRAFT_GRAPH_RUNNER, "EAGLEDraftExtendCudaGraphRunner.execute"),
    (DRAFT_GRAPH_RUNNER, "EAGLEDraftExtendCudaGraphRunner.capture_one_shape"),
    (DRAFT_GRAPH_RUNNER, "EAGLEDraftExtendCudaGraphRunner.can_run_graph"),
    (DRAFT_GRAPH_RUNNER, "EagleDraftExtendInputBuffers"), (DRAFT_GRAPH_RUNNER, "DeepEPCudaGraphRunnerAdapter"),
    (EAGLE_INFO, "EagleDraftExtendInput"), (BUCKETS, "generate_decode_cuda_graph_batch_sizes"),
    (SERVER_ARGS, "ServerArgs"), (RUNTIME, "publish"), (SPEC_HOOK, "_resolve_speculative_algorithm_alias"),
    (GRAPH_RUNNER, "PrefillCudaGraphRunner._prepare_forward_metadata_for_replay"),
    (GRAPH_RUNNER, "PrefillCudaGraphRunner.execute"), (GRAPH_RUNNER, "PrefillCudaGraphRunner.load_batch"),
    (GRAPH_RUNNER, "PrefillCudaGraphRunner.can_run_graph"), (GRAPH_RUNNER, "_PREFILL_STATIC_FIELDS"),
    (BUFFER_REGISTRY, "build_prefill_registry"), (INPUT_BUFFERS, "_forward_input_buffer_pool"),
    (BREAKABLE_BACKEND, "BreakableCudaGraphBackend"), (GRAPH_CONFIG, "Backend"), (GRAPH_CONFIG, "ALLOWED_BACKENDS_PER_PHASE"), (GRAPH_CONFIG, "Phase"), (SHAPE_KEY, "ShapeKey"),
    (MODEL_CONFIG, "is_piecewise_cuda_graph_disabled_model"), (MODEL, "deepseek_v4_attention_with_output"),
    (TC_CONTEXT, "get_tc_piecewise_forward_context"), (TC_CONTEXT, "_tc_piecewise_forward_context"),
]
# Whether a batch runs context-parallel: `is_cp_active` from 0.5.20 on, `is_cp_v2_active` in 0.5.19.
CP_PREDICATES = ("is_cp_active", "is_cp_v2_active")


# Compiled extensions SGLang imports on a CUDA host, stood in only where they cannot be loaded: its CUDA kernels
# (sglang-kernel), flashinfer's, which 0.5.19's fp8 utilities import on CUDA, and DeepGEMM's, which DSV4's model
# module imports on CUDA (0.5.23's Mega mHC, `kernels/ops/layernorm/mhc_mega.py`; the target calls none of its
# ops: it takes only the model's attention op, `eager.EagerPath._graph_op`).
COMPILED_EXTENSIONS = ("sgl_kernel", "flashinfer", "deep_gemm")


class StandInUsed(EnvironmentBroken):
    """SGLang called into a compiled extension that could not be loaded here: the run cannot vouch."""


_IMPORTLIB_DIR = os.path.dirname(importlib.__file__)


def _is_import_machinery(path: str) -> bool:
    return path.startswith("<frozen importlib") or path.startswith(_IMPORTLIB_DIR)


def _caller() -> str:
    """The innermost frame outside this module: the line that used the stand-in."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename == __file__ or _is_import_machinery(frame.f_code.co_filename)):
        frame = frame.f_back
    if frame is None:
        return "an unknown caller"
    path = frame.f_code.co_filename
    marker = f"{os.sep}sglang{os.sep}"
    shown = path[path.rfind(marker) + 1:] if marker in path else os.path.basename(path)
    return f"{frame.f_code.co_name} at {shown}:{frame.f_lineno}"


class _Recorder:
    """An attribute of a stood-in module: its attributes are recorders too; calling one is recorded and raises."""

    def __init__(self, stand_ins: "StandIns", name: str):
        self._stand_ins, self._name = stand_ins, name

    def __getattr__(self, attr: str) -> "_Recorder":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Recorder(self._stand_ins, f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        use = f"{self._name}() called by {_caller()}"
        self._stand_ins.uses.append(use)
        raise StandInUsed(f"--target sglang: {use}, but {self._name.split('.')[0]} is a stand-in here "
                          f"({self._stand_ins.reasons[self._name.split('.')[0]]}): the case cannot vouch")


class _StandInModule(types.ModuleType):
    def __init__(self, stand_ins: "StandIns", name: str):
        super().__init__(name)
        self.__path__: list[str] = []  # a package: its submodules are stand-ins too
        self._stand_ins = stand_ins

    def __getattr__(self, attr: str) -> _Recorder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Recorder(self._stand_ins, f"{self.__name__}.{attr}")


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The recording stand-ins for compiled extensions that cannot be loaded, as an import finder."""

    def __init__(self):
        self.reasons: dict[str, str] = {}  # top-level module -> why it could not be loaded
        self.importers: dict[str, list[str]] = {}  # module -> the lines that imported it
        self.uses: list[str] = []  # every call of a recorder, in order

    def stand_in_unloadable(self, names) -> None:
        for name in names:
            try:
                importlib.import_module(name)
            except (ImportError, OSError) as exc:
                for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                    del sys.modules[loaded]
                self.reasons[name] = f"{type(exc).__name__}: {exc}"[:300]
        if self.reasons and self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.split(".")[0] in self.reasons:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec) -> _StandInModule:
        self.importers.setdefault(spec.name, []).append(_caller())
        return _StandInModule(self, spec.name)

    def exec_module(self, module) -> None:
        """A stand-in has no code to run."""

    def describe(self) -> list[dict]:
        return [{"module": name, "reason": why, "imported_by": self.importers.get(name, [])[:3]}
                for name, why in self.reasons.items()]

    def check_unused(self, since: int) -> None:
        """A case that called a stand-in cannot vouch, even if the caller swallowed the error."""
        if len(self.uses) > since:
            raise StandInUsed(f"--target sglang: the case called stood-in compiled code: {self.uses[since]}")


@dataclass
class SglangApi:
    """The real SGLang objects, by role."""

    version: str
    generation: Generation  # the API generation this version belongs to (`generations`)
    kernels_on: DeviceKind = DeviceKind.CPU  # CPU: Triton kernels interpreted; CUDA: compiled
    mods: dict[str, Any] = field(default_factory=dict)
    stand_ins: StandIns = field(default_factory=StandIns)

    @property
    def semantics(self) -> Semantics:
        """The reference model's semantics of this version's design: "0.5.23" (resolver) or "pr"."""
        return self.generation.semantics

    @property
    def binds_kv_plan(self) -> bool:
        """A ForwardBatch carries the iteration's KV-slot plan (`KVIndexTranslator.own_plan`, from 0.5.22 on),
        which the graph runner's `load_batch` binds to its static buffer."""
        return hasattr(self.mods["kv_translator"].KVIndexTranslator, "own_plan")

    @property
    def backend_cls(self):
        return self.mods["backend"].DeepseekV4AttnBackend

    @property
    def graph_contracts(self) -> tuple[str, ...]:
        """The prefill-graph contracts a DSV4 server of this release replays (`Case.graph_contract`): the breakable
        graph replaying the backend's captured metadata (`bcg`: DSV4's `use_captured_forward_metadata_for_breakable_
        cuda_graph`), and the tc_piecewise replay that plans fresh metadata (`fresh`) only where the release offers
        that backend and SGLang's own server resolution keeps it for DSV4. None does: 0.5.22 removed the backend
        ("tc_piecewise was removed; select breakable, full, or disabled"), and 0.5.19 to 0.5.21 list DSV4's
        architectures in `piecewise_cuda_graph_disabled_model_archs`, so `disable_tc_piecewise_cudagraph_if_
        incompatible` turns a DSV4 server's tc_piecewise prefill graph off ("model-arch blacklist"). The full
        backend is no prefill contract of DSV4 (its out-of-graph init raises for EXTEND)."""
        config = self.mods["graph_config"]
        prefill = config.ALLOWED_BACKENDS_PER_PHASE[config.Phase.PREFILL]
        offered = getattr(config.Backend, "TC_PIECEWISE", None) in prefill
        kept = not self.mods["model_config"].is_piecewise_cuda_graph_disabled_model(DSV4_ARCHITECTURES)
        return GRAPH_CONTRACTS if offered and kept else ("bcg",)

    def is_cp_active(self, forward_batch) -> bool:
        """This version's own predicate for a context-parallel batch (renamed in 0.5.20)."""
        cp_utils = self.mods["cp_utils"]
        return next(getattr(cp_utils, name) for name in CP_PREDICATES if hasattr(cp_utils, name))(forward_batch)

    def describe(self) -> str:
        how = "interpreted, CPU" if self.kernels_on is DeviceKind.CPU else "compiled, CUDA"
        return (f"sglang {self.version}, adapter {self.generation.name}: {self.generation.detail}, "
                f"Triton kernels {how}")

    def check_device(self, kind: str) -> None:
        """SGLang's kernels run on the device kind they were defined for in this process."""
        if kind == self.kernels_on:
            return
        if DeviceKind(kind) is DeviceKind.CUDA:
            raise EnvironmentBroken(
                f"--target sglang --device cuda: TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r} made "
                "SGLang's Triton kernels interpreted in this process; unset it to run them compiled on the GPU")
        raise EnvironmentBroken(
            f"--target sglang --device {kind}: SGLang's Triton kernels were compiled for CUDA in this process (a GPU "
            "is visible); the CPU simulator needs them interpreted: set TRITON_INTERPRET=1")


def prepare_triton() -> None:
    """Before triton is first imported: interpret its kernels unless a CUDA device is visible.

    An explicit TRITON_INTERPRET is left as it is; once triton is imported the choice is made."""
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _import_failure(module: str, exc: Exception) -> str:
    """The error and the innermost line of sglang that raised it: what a missing dependency needs."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}sglang{os.sep}" in f.filename]
    where = ""
    if frames:
        path = frames[-1].filename
        where = f", at {path[path.rfind(f'{os.sep}sglang{os.sep}') + 1:]}:{frames[-1].lineno}"
    return f"cannot import {module} ({type(exc).__name__}: {exc}{where})"


@functools.lru_cache(maxsize=1)
def load_api() -> SglangApi:
    """Import sglang (once) and check that every real object the target drives is present."""
    prepare_triton()
    stand_ins = StandIns()
    if os.environ.get("TRITON_INTERPRET") != "1":  # a CUDA host: SGLang's CUDA branches import its extensions
        stand_ins.stand_in_unloadable(COMPILED_EXTENSIONS)
        if "flashinfer" in stand_ins.reasons:  # SGLang's own switch for a host without it: its optional uses stay off
            os.environ.setdefault("SGLANG_IS_FLASHINFER_AVAILABLE", "false")
    try:
        version = dist_version("sglang")
    except PackageNotFoundError:
        raise EnvironmentBroken("--target sglang: the sglang package is not installed "
                                "(pip install --no-deps sglang==0.5.23 plus its CPU import deps; see "
                                "harness/sglang_target/__init__.py)") from None
    missing: list[str] = []
    import_errors: dict[str, str] = {}

    def have(items) -> list[str]:
        lost = []
        for module, dotted in items:
            if module in import_errors:
                lost.append(f"{module}.{dotted}")
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    obj = importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - any import-time failure is a broken environment
                import_errors[module] = _import_failure(module, exc)
                lost.append(f"{module}.{dotted}")
                continue
            try:
                for part in dotted.split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                lost.append(f"{module}.{dotted}")
        return lost

    missing += have(_COMMON)
    generation = recognise(lambda module, dotted: not have([(module, dotted)]))
    if generation is None:
        missing += [f"{module}.{dotted} (the {g.name} generation's marker)" for g in GENERATIONS
                    for module, dotted in g.markers if have([(module, dotted)])]
    else:
        missing += have(generation.names)
    if not any(not have([(CP_UTILS, name)]) for name in CP_PREDICATES):
        missing.append(f"{CP_UTILS}.{' or '.join(CP_PREDICATES)}")
    if import_errors:  # the first failure is the cause; later ones are often its echo (a half-imported package)
        raise EnvironmentBroken(f"--target sglang: the installed sglang {version} does not import here: "
                                f"{next(iter(import_errors.values()))}; {len(dict.fromkeys(missing))} of the "
                                "names the target drives are unavailable")
    if missing:
        raise EnvironmentBroken(f"--target sglang: the installed sglang {version} lacks "
                                f"{', '.join(dict.fromkeys(missing))}")

    mods = {name: importlib.import_module(path) for name, path in dict(
        backend=BACKEND, base_backend=BASE_BACKEND, sparse_utils=SPARSE_UTILS, kernels=KERNELS, publisher=PUBLISHER,
        spec=SPEC, environ=ENVIRON, runtime=RUNTIME, forward=FORWARD, cp_base=CP_BASE, cp_utils=CP_UTILS,
        buckets=BUCKETS, graph_runner=GRAPH_RUNNER, base_graph_runner=BASE_GRAPH_RUNNER, base_runner=BASE_RUNNER,
        scheduler=SCHEDULER, tp_worker=TP_WORKER, spec_worker=SPEC_WORKER, eagle_worker=EAGLE_WORKER,
        draft_graph_runner=DRAFT_GRAPH_RUNNER, eagle_info=EAGLE_INFO,
        eager_runner=EAGER_RUNNER,
        model_runner=MODEL_RUNNER, buffer_registry=BUFFER_REGISTRY, forward_context=FORWARD_CONTEXT, logits=LOGITS,
        kv_translator=KV_TRANSLATOR, swa_kernels=generation.swa_kernels_module, server_args=SERVER_ARGS,
        spec_hook=SPEC_HOOK, shape_key=SHAPE_KEY, breakable_backend=BREAKABLE_BACKEND,
        graph_config=GRAPH_CONFIG, input_buffers=INPUT_BUFFERS, model=MODEL, tc_context=TC_CONTEXT,
        model_config=MODEL_CONFIG).items()}
    if generation.runs_cp:
        mods["cp_interleave"] = importlib.import_module(CP_INTERLEAVE)
    publish = mods["publisher"].maybe_publish_prefill_shared_read_done
    params = list(inspect.signature(publish).parameters)
    want = "shared_read_ends" if generation.publishes_from_read_end else "forward_batch"
    if len(params) < 3 or params[1] != want:
        raise EnvironmentBroken(f"--target sglang: sglang {version} maybe_publish_prefill_shared_read_done{params} "
                                f"does not take {want!r} second, as the {generation.name} generation needs")
    kernels_on = _check_kernels(mods["kernels"], version)
    if kernels_on is DeviceKind.CPU:
        _tune_interpreter(mods["kernels"], mods["swa_kernels"])
    return SglangApi(version=version, generation=generation, kernels_on=kernels_on, mods=mods, stand_ins=stand_ins)


def _check_kernels(kernels, version: str) -> DeviceKind:
    """CPU when both kernels are interpreted, CUDA when both are compiled (one mode per process)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def unwrap(kernel):  # through our retiling wrapper and triton's autotuner / heuristics wrappers
        if isinstance(kernel, RetiledKernel):
            kernel = kernel.kernel
        while not isinstance(kernel, (JITFunction, InterpretedFunction)) and hasattr(kernel, "fn"):
            kernel = kernel.fn
        return kernel

    interpreted = {name: isinstance(unwrap(getattr(kernels, name)), InterpretedFunction) for name in TRITON_KERNELS}
    if len(set(interpreted.values())) != 1:
        raise EnvironmentBroken(f"--target sglang: sglang {version}'s Triton kernels are part interpreted, part "
                                f"compiled ({interpreted}): TRITON_INTERPRET changed while triton was imported")
    return DeviceKind.CPU if interpreted[TRITON_KERNELS[0]] else DeviceKind.CUDA


def _tune_interpreter(kernels, launcher) -> None:
    """The interpreter's settings for the simulator: overflow checks off, wide tiles for large launches, every
    memory access checked (`memcheck`). `launcher`: the module whose wrapper launches the combine kernel (it holds
    its own reference to it)."""
    from triton.runtime import interpreter

    # The interpreter checks every int32 add/sub/mul for overflow, a debug check that compiled kernels run
    # only under debug=True; it is half of the interpreted time. Off, as on the GPU.
    builder = getattr(interpreter, "interpreter_builder", None)
    options_cls = getattr(interpreter, "InterpreterOptions", None)
    if builder is not None and options_cls is not None and getattr(builder.options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    _loop_variables_as_tensors(interpreter)
    memcheck.install(interpreter)  # an interpreted kernel's stray access is a finding, not a corrupted heap
    _retile(kernels._combine_topk_swa_indices_kernel, "BLOCK_T", {kernels, launcher},
            "_combine_topk_swa_indices_kernel")
    dequant = importlib.import_module(DEQUANT)  # the real forward dequantizes the SWA and compressed caches
    _retile(dequant._dequantize_k_cache_paged_kernel, "TOKENS_PER_PROG", {dequant}, "_dequantize_k_cache_paged_kernel")


def _retile(kernel, block: str, modules, name: str) -> None:
    """`kernel` as `RetiledKernel` over its `block` argument, in every module that holds it by `name` (each
    launcher holds its own reference); a kernel without `block` and `num_tokens` parameters is left as it is."""
    if isinstance(kernel, RetiledKernel):
        return
    params = inspect.signature(kernel.fn).parameters
    if block in params and "num_tokens" in params:
        retiled = RetiledKernel(kernel, block)
        for module in modules:
            setattr(module, name, retiled)


def _loop_variables_as_tensors(interpreter) -> None:
    """Triton's interpreter runs `for i in range(start, end, step)` over Python ints, where a compiled kernel's
    induction variable is a tensor: the PR-era combine kernel's `token_idx.to(tl.int64)` works compiled and
    raises interpreted. Its source rewriter already makes every assigned value a tensor (`to_tensor`); a loop
    body now starts by doing the same to its loop variable. Nothing else of the kernel changes."""
    transformer = interpreter.ASTTransformer
    if "visit_For" in vars(transformer):
        return

    def visit_for(self, node):
        self.generic_visit(node)
        if isinstance(node.target, ast.Name):
            name = node.target.id
            as_tensor = ast.Call(
                func=ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor",
                                   ctx=ast.Load()),
                args=[ast.Name(id=name, ctx=ast.Load()), ast.Constant(value=False)], keywords=[])
            node.body.insert(0, ast.copy_location(
                ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=as_tensor), node))
            ast.fix_missing_locations(node)
        return node

    transformer.visit_For = visit_for


class RetiledKernel:
    """Interpreter launch retiling of a token-parallel SGLang kernel, for large inputs only.

    SGLang launches `_combine_topk_swa_indices_kernel` with BLOCK_T=2 tokens per program and
    `_dequantize_k_cache_paged_kernel` with TOKENS_PER_PROG=4 (tuned on a B200); interpreted, each program
    costs ~20-30 ms, so the 11674-row batches at the sparse threshold took minutes. Each kernel is written for
    any power-of-two block (`token = pid * BLOCK + arange(BLOCK)`, masked by `token < num_tokens`: "the grid
    shape does not change any output bit"), so above `ABOVE` rows the same kernel is launched with `BLOCK`
    tokens per program and the grid to match; below it (every small drawn case) SGLang's own launch runs
    unchanged.
    """

    ABOVE = 1024
    BLOCK = 128

    def __init__(self, kernel, block: str):
        self.kernel, self.block = kernel, block
        self.fn = kernel.fn
        self._signature = inspect.signature(kernel.fn)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = {k: v for k, v in kwargs.items() if k in self._signature.parameters}
            num_tokens = int(self._signature.bind_partial(*args, **named).arguments["num_tokens"])
            if num_tokens > self.ABOVE:
                kwargs[self.block] = self.BLOCK
                return self.kernel[(-(-num_tokens // self.BLOCK),)](*args, **kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch

    def __getattr__(self, name):
        return getattr(self.kernel, name)
