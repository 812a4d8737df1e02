"""A case: one drawn configuration, as plain data that round-trips through JSON.

The replay command of every finding carries the case as JSON, so everything that decides what
runs lives here and nothing else (the schedule policy and the device are the only other inputs).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from harness.errors import InvalidArgument
from harness.model.enums import ForwardMode, SpeculativeAlgorithm
from harness.semantics import SEMANTICS, Semantics

GRAPH_CONTRACTS = ("fresh", "bcg")
CP_SIZE = 2  # the CP width of a server a case turns CP on for (`Flags.cp_active`): two interleaved ranks
MUTATION_KINDS = (
    "req_to_token_rewrite",  # rewrite rows of req_to_token (R1, radix row rewrites)
    "req_pool_reuse",  # a finished request's pool index is reused by a new request (R1/#18803)
    "swa_clear",  # full_to_swa.index_fill_(0, idx, 0) of in-window tokens (R2/R9, #35773)
    "swa_repoint",  # full_to_swa entries re-pointed at other SWA slots (R9)
    "kv_realloc",  # free in-window KV slots and reallocate them to a new request
    "batch_rebind",  # the per-batch tensors' storage is reused for the next batch (R15/R17)
    "hisparse_evict",  # HiSparse evicts entries of full_to_hisparse
)
MUTATION_TARGETS = ("batch", "other")
# How the KV cache holds a latent: "float32" (the reference model's pools), or "fp8_v4" (DSV4's cache as SGLang
# stores it: per 64-wide tile of the 448 NoPE values an e4m3 code and a power-of-two scale, the 64 RoPE values
# in bf16). A world of an "fp8_v4" case draws its data exactly representable there (`harness.world`).
KV_FORMATS = ("float32", "fp8_v4")
FP8_V4_NOPE = 448  # the NoPE width of a DSV4 latent; the other 64 values are RoPE
_LARGE_SEQ = 1 << 16
# A case's limits, beyond anything the strategies draw (a batch of up to 65 requests and 32768 tokens,
# two or three batches, 64 heads, SGLang's page 256, window 128 and top-k 512): a replay of one case far past them ran minutes, or overflowed deep
# in the run (a data_seed of 2**70 in torch's generator), instead of being refused when it was read.
LIMITS = {"batches": 16, "requests": 256, "tokens": 32_768, "heads": 128, "head_dim": 1024, "index_dim": 1024,
          "swa_window": 8192, "index_topk": 8192, "page_size": 4096, "index_align": 4096, "mutation count": 1024,
          "delay_cycles": 2**31 - 1, "data_seed": 2**32 - 1}


@dataclass(frozen=True)
class Dims:
    """Model sizes. SGLang's real ones: 64 heads, head_dim 512, window 128, top-k 512, page 256.
    `kv_format`: see `KV_FORMATS`; "fp8_v4" needs head_dim 512 (448 NoPE + 64 RoPE)."""

    heads: int = 2
    head_dim: int = 8
    swa_window: int = 8
    index_topk: int = 4
    index_dim: int = 4
    page_size: int = 4
    layer_ratios: tuple[int, ...] = (0, 4, 128)
    index_align: int = 128
    kv_format: str = "float32"

    def validate(self) -> None:
        for name in ("heads", "head_dim", "swa_window", "index_topk", "index_dim", "page_size", "index_align"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"dims.{name}={value!r}: must be an integer >= 1")
            _check_limit(f"dims.{name}", value, LIMITS.get(name))
        if not self.layer_ratios:
            raise InvalidArgument("dims.layer_ratios is empty: give at least one layer, ratios from 0, 4, 128")
        for ratio in self.layer_ratios:
            if ratio not in (0, 4, 128):
                raise InvalidArgument(f"dims.layer_ratios contains {ratio!r}: allowed ratios are 0, 4, 128")
        if self.kv_format not in KV_FORMATS:
            raise InvalidArgument(f"dims.kv_format={self.kv_format!r} is not one of: {', '.join(KV_FORMATS)}")
        if self.kv_format == "fp8_v4" and self.head_dim != FP8_V4_NOPE + 64:
            raise InvalidArgument(f"dims.kv_format='fp8_v4' needs head_dim {FP8_V4_NOPE + 64} (448 NoPE + 64 RoPE), "
                                  f"got {self.head_dim}")


@dataclass(frozen=True)
class Flags:
    """SGLang's switches, by their SGLang names; None means the semantics' default."""

    SGLANG_ENABLE_PREFILL_WAR_READ_DONE: bool | None = None
    SGLANG_FORCE_COARSE_WAR_BARRIER: bool = False
    SGLANG_OPT_FLASHMLA_SPARSE_PREFILL: bool = True
    cp_active: bool = False
    hisparse: bool = False
    hierarchical_cache: bool = False
    hicache_storage: bool = False
    lmcache: bool = False

    # The gates a campaign may turn on, each closing the publish decision alone (`--without` takes these).
    GATES = ("SGLANG_FORCE_COARSE_WAR_BARRIER", "cp_active", "hisparse", "hierarchical_cache", "hicache_storage",
             "lmcache")
    # Paths under a gate that `--without` may leave out instead of the whole gate: where a release has a known bug on
    # one path (every release's sparse prefill under HiSparse reads the c4 cache at logical slots), leaving the gate
    # out would lose the gate's other paths too. `hisparse_sparse_prefill`: a HiSparse case prefills dense.
    HISPARSE_SPARSE_PREFILL = "hisparse_sparse_prefill"
    PATHS = (HISPARSE_SPARSE_PREFILL,)

    def prefill_read_done_enabled(self, semantics: Semantics) -> bool:
        """Unset: the semantics' default (`Semantics.read_done_by_default`)."""
        if self.SGLANG_ENABLE_PREFILL_WAR_READ_DONE is None:
            return Semantics(semantics).read_done_by_default
        return self.SGLANG_ENABLE_PREFILL_WAR_READ_DONE

    def offloads_kv(self) -> bool:
        return self.hierarchical_cache or self.hicache_storage or self.lmcache

    @property
    def has_prefill_graph(self) -> bool:
        """Whether the server replays a prefill graph at all: not under CP. SGLang's server resolution turns the
        prefill graph off under CP where the CP strategy has no breakable graph of its own for the attention backend
        ("context parallel (attn_cp_size > 1)" in `disable_*_cudagraph_if_incompatible`, 0.5.19 to 0.5.23;
        `PREFILL_CP_BCG_SUPPORTED_COMBINATIONS` has no DSV4 pair), so every batch of a CP case runs eagerly."""
        return not self.cp_active

    def cp_shards(self, mode: ForwardMode, num_tokens: int) -> bool:
        """Whether the server shards a batch of `mode` and `num_tokens` tokens across its CP ranks: SGLang's
        `is_cp_active` under the interleave strategy (`InterleaveCPStrategy.can_apply`, every release): CP on, an
        EXTEND or MIXED batch (`is_context_parallel_extend`), and at least as many tokens as ranks. A smaller batch
        runs whole on every rank, as on a server without CP (its snapshot, publish and sparse prefill included);
        what CP decides server-wide (the eager runner keeps MIXED, the verify is static) asks `cp_active`."""
        return self.cp_active and mode in (ForwardMode.EXTEND, ForwardMode.MIXED) and num_tokens >= CP_SIZE


@dataclass(frozen=True)
class Request:
    prefix_len: int
    extend_len: int

    @property
    def seq_len(self) -> int:
        return self.prefix_len + self.extend_len


@dataclass(frozen=True)
class Mutation:
    kind: str
    target: str = "batch"
    count: int = 1
    poison: bool = False


@dataclass(frozen=True)
class Batch:
    mode: ForwardMode = ForwardMode.EXTEND
    requests: tuple[Request, ...] = (Request(0, 4),)
    graph: bool = False
    mutations: tuple[Mutation, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(r.extend_len for r in self.requests)


@dataclass(frozen=True)
class Case:
    semantics: Semantics = Semantics.V0_5_23
    spec: SpeculativeAlgorithm = SpeculativeAlgorithm.NONE
    flags: Flags = Flags()
    dims: Dims = Dims()
    batches: tuple[Batch, ...] = (Batch(),)
    graph_contract: str = "fresh"
    delay_cycles: int = 0
    data_seed: int = 0

    def __post_init__(self) -> None:
        """A known semantics name becomes its `Semantics` here, so every layer asks it what it does; an
        unknown one is left for `validate` to name."""
        if self.semantics in SEMANTICS:
            object.__setattr__(self, "semantics", Semantics(self.semantics))

    def validate(self) -> "Case":
        """Eager validation: every field is checked here, so nothing deep inside fails on bad input."""
        if self.semantics not in SEMANTICS:
            raise InvalidArgument(f"semantics={self.semantics!r} is not one of: {', '.join(SEMANTICS)}")
        if self.graph_contract not in GRAPH_CONTRACTS:
            raise InvalidArgument(f"graph_contract={self.graph_contract!r} is not one of: {', '.join(GRAPH_CONTRACTS)}")
        self.dims.validate()
        if not self.batches:
            raise InvalidArgument("batches is empty: a case runs at least one batch")
        _check_limit("batches", len(self.batches), LIMITS["batches"], what="batches")
        for name in ("delay_cycles", "data_seed"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name}={getattr(self, name)}: must be >= 0")
            _check_limit(name, getattr(self, name), LIMITS[name])
        for i, batch in enumerate(self.batches):
            where = f"batches[{i}]"
            _check_limit(f"{where}.requests", len(batch.requests), LIMITS["requests"], what="requests")
            _check_limit(f"{where}: tokens (the extend_len of its requests together)", batch.num_tokens,
                         LIMITS["tokens"])
            if batch.mode is ForwardMode.IDLE:
                if batch.requests:
                    raise InvalidArgument(f"{where}: an IDLE batch has no requests")
            elif not batch.requests:
                raise InvalidArgument(f"{where}: mode {batch.mode.name} needs at least one request")
            for j, req in enumerate(batch.requests):
                if req.prefix_len < 0 or req.extend_len < 1:
                    raise InvalidArgument(
                        f"{where}.requests[{j}]: prefix_len={req.prefix_len} must be >= 0 and "
                        f"extend_len={req.extend_len} must be >= 1"
                    )
                if req.seq_len > _LARGE_SEQ:
                    raise InvalidArgument(f"{where}.requests[{j}]: seq_len {req.seq_len} exceeds {_LARGE_SEQ}")
                if batch.mode is ForwardMode.DECODE and req.extend_len != 1:
                    raise InvalidArgument(f"{where}.requests[{j}]: extend_len={req.extend_len} in a DECODE batch; "
                                          "allowed: 1 (a decode step adds one token a request: SGLang's decode "
                                          "metadata plans one write location a request)")
            for m in batch.mutations:
                if m.kind not in MUTATION_KINDS:
                    raise InvalidArgument(f"{where}: mutation kind {m.kind!r} is not one of: {', '.join(MUTATION_KINDS)}")
                if m.target not in MUTATION_TARGETS:
                    raise InvalidArgument(f"{where}: mutation target {m.target!r} is not one of: {', '.join(MUTATION_TARGETS)}")
                if m.count < 1:
                    raise InvalidArgument(f"{where}: mutation count {m.count} must be >= 1")
                _check_limit(f"{where}: mutation count", m.count, LIMITS["mutation count"])
        return self

    # -- JSON -----------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(_encode(self), separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Case":
        """`batches` must be given: every other field has a default a replay may leave out, but `{}`
        once replayed a default batch and passed, a typo in a hand-written case reading as clean."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"case: not valid JSON ({exc.msg} at char {exc.pos})") from None
        if not isinstance(raw, dict):
            raise InvalidArgument("case: expected a JSON object")
        case = _decode_case(raw).validate()
        if "batches" not in raw:
            raise InvalidArgument("case: the field batches is missing: a case runs the batches it lists (a "
                                  "finding's replay command holds a whole case)")
        return case

    def summary(self) -> str:
        """One line a person can read: the geometry and the switches that matter."""
        parts = [f"sem={self.semantics}", f"spec={self.spec.name}"]
        on = [k for k, v in dataclasses.asdict(self.flags).items() if v is True and k != "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL"]
        if not self.flags.SGLANG_OPT_FLASHMLA_SPARSE_PREFILL:
            on.append("OPT_SPARSE=0")
        if self.flags.SGLANG_ENABLE_PREFILL_WAR_READ_DONE is False:
            on.append("READ_DONE=0")
        if on:
            parts.append("flags=" + ",".join(on))
        for b in self.batches:
            reqs = " ".join(f"{r.prefix_len}+{r.extend_len}" for r in b.requests)
            muts = ",".join(f"{m.kind}{'!' if m.poison else ''}" for m in b.mutations) or "-"
            parts.append(f"[{b.mode.name}{' graph' if b.graph else ''} {reqs} mut={muts}]")
        return " ".join(parts)


def _check_limit(name: str, value: int, limit: int | None, *, what: str = "") -> None:
    """`value` of the field `name` at most `limit` (`LIMITS`; None: no limit)."""
    if limit is not None and value > limit:
        counted = f" {what}" if what else ""
        raise InvalidArgument(f"{name}: {value:,}{counted} is over the limit of {limit:,}{counted} "
                              f"(the harness's limits: {', '.join(f'{k} {v:,}' for k, v in LIMITS.items())})")


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (ForwardMode, SpeculativeAlgorithm)):
        return value.name
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def _decode(cls, raw: Any, where: str):
    """One dataclass from its JSON object, every field checked against its annotation before any work,
    so a wrong type is named here (`case.batches[0].requests[1].extend_len`), never deep in a run."""
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{where}={raw!r}: expected an object with the fields {', '.join(names)}")
    unknown = sorted(map(str, set(raw) - set(names)))
    if unknown:
        raise InvalidArgument(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}")
    hints = typing.get_type_hints(cls)
    try:
        return cls(**{name: _value(hints[name], value, f"{where}.{name}") for name, value in raw.items()})
    except TypeError as exc:  # a required field left out
        raise InvalidArgument(f"{where}: {exc}") from None


def _value(kind: Any, value: Any, where: str) -> Any:
    """A JSON value as the annotated type: an object, a list for a tuple, an enum by name, a scalar."""
    if kind is ForwardMode:
        return _enum(ForwardMode, value, where)
    if kind is SpeculativeAlgorithm:
        if not isinstance(value, str):
            raise InvalidArgument(f"{where}={value!r}: expected the algorithm's name, a string")
        return SpeculativeAlgorithm.parse(value)
    if dataclasses.is_dataclass(kind):
        return _decode(kind, value, where)
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, list):
            raise InvalidArgument(f"{where}={value!r}: expected a list")
        return tuple(_value(args[0], item, f"{where}[{i}]") for i, item in enumerate(value))
    if typing.get_origin(kind) in (types.UnionType, typing.Union):  # `bool | None`: null is the default
        if value is None:
            return None
        (kind,) = [a for a in args if a is not type(None)]
    if kind is Semantics:  # a string here; `Case.validate` names one that is no semantics
        kind = str
    expected = {bool: "true or false", int: "an integer", str: "a string"}[kind]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidArgument(f"{where}={value!r}: expected {expected}")
    return value


def _enum(enum, name: Any, where: str):
    if isinstance(name, str) and name in enum.__members__:
        return enum[name]
    raise InvalidArgument(f"{where}={name!r} is not one of: {', '.join(m.name for m in enum)}")


def _decode_case(raw: dict) -> Case:
    return _decode(Case, raw, "case")
