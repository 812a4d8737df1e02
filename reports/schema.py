"""The one schema of every JSON file a report folder holds: a pydantic model per file.

The writers validate what they write against their file's model (`check_written`, through
`reports.writers.write_report`), and every reader (the folder's loading, so `harness report`, `merge`
and the page) validates what it reads against the same model (`read_report`): a writer cannot write a
file that the reader refuses, and a file cut short or edited by hand is refused naming the file and the
field (`ReportError`, exit 2), never rendered as a clean report.

Validation is strict: a count written as "7" is refused, not read as 7. A reader ignores fields it does
not know (a newer harness's files still load); a writer may write only the fields declared here, so each
model is the whole description of its file. What another module shapes and the page only shows (a case,
a finding's details, NVML's readings, a benchmark's own figures) is typed as an object and not spelled out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter, ValidationError

from harness.case import Flags
from harness.errors import InvalidArgument

SUMMARY, REPLAY_SUMMARY = "summary.json", "replay-summary.json"
MUTANTS, CLEAN_REFERENCE = "mutants.json", "mutants-clean.json"
TRIAGE, VERSIONS = "triage.json", "versions.json"
SANITIZER, KERNEL, NIGHTLY, CSAN = "sanitizer.json", "kernel.json", "nightly.json", "csan.json"

SANITIZER_STATUSES = ("clean", "found", "failed")
STEP_OUTCOMES = ("clean", "found", "broken", "skipped", "interrupted")
SHAPE_ERROR = "report_shape"  # a value that has none of its field's shapes; its message follows the field's name


class ReportError(InvalidArgument):
    """A report file exists but cannot be used; the message names the file and what is wrong."""


class UnwritableReport(RuntimeError):
    """A command built a report file its schema refuses: the harness's own bug (exit 5), never the user's."""


class Record(BaseModel):
    """A JSON object of a report file; fields not declared are ignored when read, refused when written."""

    model_config = ConfigDict(extra="ignore")


_TAGS: set[str] = set()  # the names of fields' shapes, which pydantic puts in an error's location


def one_of(shape: Callable[[Any], str | None], choices: dict[str, Any], neither: str = "") -> Any:
    """A value with several shapes, told apart by `shape` (the name of the value's shape, or None when it
    has none of them: then the error says `neither`). The shapes' names stay out of printed field paths."""
    _TAGS.update(choices)
    return Annotated[Union[tuple(Annotated[kind, Tag(name)] for name, kind in choices.items())],
                     Discriminator(shape, custom_error_type=SHAPE_ERROR, custom_error_message=neither)]


def marked_by(keys: dict[str, str]) -> Callable[[Any], str | None]:
    """The shape of an object told by the first of `keys` it holds (key -> the shape's name), None for any other."""
    def shape(value) -> str | None:
        return next((name for key, name in keys.items() if key in value), None) if isinstance(value, dict) else None
    return shape


# -- summary.json: harness/campaign.py CampaignResult.summary, the fields harness/commands/run.py adds, and
#    reports/merge.py merge_summaries; also replay-summary.json and a triage's campaign -------------------

Gate = Literal[Flags.GATES + Flags.PATHS]


class FirstDetection(Record):
    examples: int
    seconds: float


class Finding(Record):
    """One finding of the reported case: harness/findings.py Finding, with the case and its replay command."""

    oracle: str
    kind: str
    message: str
    case_summary: str
    replay: str
    batch: int | None = None
    severity: str | None = None  # correctness | performance
    details: dict[str, Any] | None = None  # what the page shows, harness/findings.py says what each holds
    case: dict[str, Any] | None = None  # harness/case.py Case.to_json
    environment_suspect: bool | None = None  # harness/telemetry.py mark_suspect (None: no telemetry)
    suspect_reasons: list[str] | None = None


StreamPhaseName = Literal["database", "seed", "coverage-first", "drawn"]  # harness/campaign.py StreamPhase


class CaseRecord(Record):
    """One judged case in `cases_log`, for the plots and the JUnit testcases."""

    i: int
    t: float
    outcome: Literal["clean", "found"]
    tokens: int
    requests: int
    graph: bool
    spec: str
    stream: int | None = None  # the case's position in the stream (None: replayed from the database)
    phase: StreamPhaseName | None = None  # the part of the stream it comes from
    case: str | None = None  # the case's digest


class Shard(Record):
    index: int
    count: int


class StandIn(Record):
    """A compiled module the sglang target stood in (harness/sglang_target)."""

    module: str
    reason: str
    imported_by: list[str]


class Coverage(Record):
    """harness/coverage.py Coverage.to_dict, or merge_tables of several parts."""

    dimensions: dict[str, dict[str, int]]
    unreached: dict[str, list[str]]
    combinations_reached: int
    full_product: int
    factored: bool | None = None
    combinations_lower_bound: bool | None = None  # merged from parts: the largest part's figure
    # the coverage-first phase's figures (None in a summary written before it): each value's first place in the
    # stream (None: never, or only by a replay from the database), the values the campaign cannot draw with why,
    # and the place by which every other value was reached
    first_reached: dict[str, dict[str, int | None]] | None = None
    unreachable: dict[str, dict[str, str]] | None = None
    reached_by: int | None = None


class WorkerRow(Record):
    """One worker's or one merged folder's part of a campaign (reports/merge.py worker_rows)."""

    folder: str
    shard: str
    cases: int
    duration_s: float
    cases_per_second: float | None = None
    cuda_visible_devices: str | None = None
    gpu: str | None = None


class NvmlRecord(Record):
    """harness/telemetry.py TelemetryRecord.to_dict: one NVML window, as a run writes it."""

    available: bool
    suspect_reasons: list[str]
    reason: str | None = None  # why telemetry is unavailable
    before: dict[str, Any] | None = None  # NVML's readings (harness/telemetry.py GpuSnapshot)
    after: dict[str, Any] | None = None
    xids: list[dict[str, Any]] | None = None
    xid_unsupported: str | None = None
    seconds: float | None = None


class GpuTelemetry(Record):
    """Telemetry of several GPUs, one NVML record each, as reports/merge.py writes it."""

    gpus: list[dict[str, Any]]
    suspect: bool
    reasons: list[str]


Telemetry = one_of(marked_by({"gpus": "<records per GPU>", "available": "<one NVML record>"}),
                   {"<records per GPU>": GpuTelemetry, "<one NVML record>": NvmlRecord},
                   "has neither 'gpus' (records per GPU) nor 'available' (one NVML record)")


class OverlapGroup(Record):
    """The batches of one kind (publishing read-done or not) of a campaign's overlapped runs, with how long before
    the forward's end the scheduler started on each one's result (harness/overlap.py OverlapGroup.to_dict)."""

    batches: int
    measured: int
    overlapped: int  # measured more than `overlapped_above_ms` before the forward's end
    min_ms: float | None
    median_ms: float | None  # of values_ms
    max_ms: float | None
    values_ms: list[float]  # the measured values, the first harness/overlap.py KEPT_VALUES of them


class MeasuredOverlap(Record):
    """The fast path's overlap, measured (CUDA)."""

    overlapped_above_ms: float
    publishing: OverlapGroup
    not_publishing: OverlapGroup


class UnmeasuredOverlap(Record):
    """The fast path's overlap, not measured, and why (the simulator has no clock)."""

    unmeasured: str


FastPathOverlap = one_of(marked_by({"publishing": "<measured>", "unmeasured": "<unmeasured>"}),
                         {"<measured>": MeasuredOverlap, "<unmeasured>": UnmeasuredOverlap},
                         "has neither 'publishing' (measured) nor 'unmeasured' (why it was not)")


class Summary(Record):
    """A campaign."""

    target: str
    device: str
    semantics: str
    cases: int
    duration_s: float
    findings: list[Finding]
    target_description: str | None = None  # what exactly is under test: a package's version and its adapter
    without: list[Gate] | None = None  # gate switches never drawn, paths under one never taken
    mutant: str | None = None
    seed: int | None = None
    profile: str | None = None
    oracles: list[str] | None = None  # those that judged
    cases_per_second: float | None = None
    first_detection: FirstDetection | None = None
    cases_log: list[CaseRecord] | None = None
    stand_ins: list[StandIn] | None = None
    shard: Shard | None = None  # None in a merge that misses shards
    shards_missing: list[int] | None = None
    workers: list[WorkerRow] | None = None
    interrupted: str | None = None  # the signal that stopped the campaign
    replayed_from_db: int | None = None
    found_on_seed: bool | None = None
    shrunk: bool | None = None
    shrink_seconds: float | None = None
    coverage: Coverage | None = None
    time: dict[str, float] | None = None  # seconds per phase
    race_gates: dict[str, int] | None = None  # how the CUDA race gates opened, counted
    fast_path_overlap: FastPathOverlap | None = None  # how long before the forward's end the scheduler started
    jobs: int | None = None
    cuda_visible_devices: str | None = None
    telemetry: Telemetry | None = None


# -- mutants.json and mutants-clean.json: harness/kill_table.py, reports/merge.py merge_mutants ----------------

class MutantRow(Record):
    name: str
    killed: bool
    oracles: list[str]
    examples_to_detect: int | None
    seconds_to_detect: float | None
    oracle: str | None = None
    description: str | None = None
    source: str | None = None  # the issue or PR the seeded bug comes from
    expected_oracle: str | None = None
    minimal_case: str | None = None
    replay: str | None = None
    contract_failures: list[str] | None = None


class CleanReference(Record):
    """The clean reference through the kill table's campaign: any finding is FOUND."""

    cases: int
    findings: int
    finding: str | None
    name: str | None = None


# -- triage.json (harness/commands/triage.py, harness/triage/static.py) and versions.json (harness/triage/versions.py)

class ContractBreak(Record):
    """harness/contracts/objects.py Break: an attribute missing on the object as built."""

    cls: str
    attribute: str
    call_path: list[str]
    file: str
    line: int


class EveryCallRead(Record):
    """harness/contracts/objects.py Read: an attribute an entry point reads on every call."""

    attribute: str
    call_path: list[str]
    file: str
    line: int


class StaticBreak(Record):
    cls: str
    attribute: str
    method: str
    file: str
    line: int


class OpenClass(Record):
    """A class whose attributes cannot be known statically."""

    cls: str
    reason: str
    file: str
    line: int | None = None


class SubclassHook(Record):
    cls: str
    attribute: str
    subclass: str
    method: str
    file: str
    line: int


class StaticTriage(Record):
    """The source check (harness/contracts/source.py static_section)."""

    target: str
    static_breaks: list[StaticBreak] | None = None
    static_unknowable: list[OpenClass] | None = None
    static_subclass_hooks: list[SubclassHook] | None = None
    static_classes: list[str] | None = None
    static_missing_modules: list[str] | None = None


class StaticOnlyTriage(StaticTriage):
    """`triage --static-only`: the source check alone."""

    static_only: Literal[True]


class FullTriage(StaticTriage):
    """`triage`: the object as built, the source, then a short campaign."""

    device: str
    semantics: str
    contract_breaks: list[ContractBreak]
    campaign: Summary
    static_only: Literal[False] | None = None
    every_call_reads: dict[str, list[EveryCallRead]] | None = None


Triage = one_of(lambda value: "<static only>" if isinstance(value, dict) and value.get("static_only") else "<full>",
                {"<static only>": StaticOnlyTriage, "<full>": FullTriage})


class VersionRow(Record):
    version: str
    status: str
    detail: str
    report: dict[str, Any] | None = None  # the version's own triage.json, as its harness wrote it


class MatrixRow(Record):
    """Version by check: the count of each check's breaks or findings (None: the check did not run)."""

    version: str
    status: str
    contract: int | None
    static: int | None
    findings: int | None
    cases: int | None
    every_call_reads: dict[str, list[str]]


class FirstRead(EveryCallRead):
    """The first version whose entry point reads an attribute on every call."""

    version: str
    entry: str


class Versions(Record):
    first_failing: str | None
    last_passing: str | None
    versions: list[VersionRow]
    matrix: list[MatrixRow] | None = None
    first_every_call_reads: list[FirstRead] | None = None


# -- sanitizer.json: harness/sanitizer/cli.py, reports/merge.py merge_sanitizer --------------------------------

class SanitizerBinary(Record):
    path: str | None
    source: str | None  # PATH | CUDA_HOME | pip
    version: str | None


class SanitizerFinding(Record):
    """harness/sanitizer/parse.py Finding."""

    kind: str | None = None
    kernel: str | None = None
    location: str | None = None
    thread: str | None = None
    block: str | None = None
    address: str | None = None
    access: str | None = None
    severity: str | None = None
    message: str | None = None


class ToolResult(Record):
    """harness/sanitizer/runner.py ToolResult.as_dict: one tool on one case."""

    tool: str
    case: str
    status: Literal[SANITIZER_STATUSES]
    ok: bool | None = None
    problem: str | None = None
    expected: str | None = None  # clean, or the planted bug's finding kind
    replay: str | None = None
    exit_code: int | None = None
    errors: int | None = None
    warnings: int | None = None
    truncated: bool | None = None
    seconds: float | None = None
    plain_seconds: float | None = None
    slowdown: float | None = None
    body_seconds: float | None = None
    plain_body_seconds: float | None = None
    plain_error: str | None = None
    kernels_seen: list[str] | None = None
    findings: list[SanitizerFinding] | None = None
    raw: dict[str, str] | None = None  # the tool's own files, by kind, under sanitizer/


class Sanitizer(Record):
    """The compute-sanitizer run; `binary: null` and the `error` when no binary was found."""

    binary: SanitizerBinary | None
    results: list[ToolResult]
    error: str | None = None
    ok: bool | None = None
    target: str | None = None
    tools: list[str] | None = None
    cases: list[str] | None = None
    jobs: int | None = None
    figures: dict[str, dict[str, Any]] | None = None  # per tool: runs, outcomes, slowdowns


# -- kernel.json: a kernel benchmark (benchmarks/sparse_kernel.py --out), shown generically ------------------

class Figures(Record):
    """A benchmark's timing of one implementation at one size; the page plots these against the roofline."""

    ms: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_roofline: float | None = None
    roofline_gbps: float | None = None


class FlatRow(Figures):
    """A row of one implementation: its name and figures."""

    name: str
    tokens: int | None = None


def _implementation(value) -> str:
    return "<implementation>" if isinstance(value, dict) and "ms" in value else "<other>"


Implementation = one_of(_implementation, {"<implementation>": Figures, "<other>": Any})


class ImplementationsRow(Record):
    """A row per size, with one object of figures per implementation (`triton: {ms, ...}`)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Implementation]

    tokens: int | None = None


def _row_shape(value) -> str:
    per_implementation = isinstance(value, dict) and any(_implementation(v) == "<implementation>" for v in value.values())
    return "<per implementation>" if per_implementation else "<flat>"


KernelRow = one_of(_row_shape, {"<per implementation>": ImplementationsRow, "<flat>": FlatRow})


class KernelBenchmark(Record):
    """The rows and, beside them, the benchmark's facts (device, shapes, ...), shown as they are."""

    rows: list[KernelRow]


def _kernel_shape(value) -> str | None:
    return "<rows>" if isinstance(value, list) else "<benchmark>" if isinstance(value, dict) else None


Kernel = one_of(_kernel_shape, {"<rows>": list[KernelRow], "<benchmark>": KernelBenchmark},
                "must be a list of rows or an object with 'rows'")


# -- nightly.json: harness/nightly.py, reports/merge.py merge_nightly -----------------------------------------

class Step(Record):
    """harness/nightly.py Step."""

    name: str
    command: list[str]
    exit_code: int | None  # None: the step did not run
    seconds: float
    outcome: Literal[STEP_OUTCOMES]


class Nightly(Record):
    exit_code: int
    steps: list[Step]
    interrupted: str | None = None


# -- csan.json: harness/commands/csan.py ----------------------------------------------------------------------

class Disagreement(Record):
    verdict: str
    explanation: str | None  # None: no known reason
    case: str
    replay: str
    ours: list[str]
    csan: list[str]
    differential: list[str]
    graph_replays: int


class Csan(Record):
    """Every case judged by our tracker, the differential oracle and PyTorch's CSAN."""

    cases: int
    verdicts: dict[str, int]
    differential_findings: int
    graph_cases: int
    unexplained: int
    disagreements: list[Disagreement]
    target: str | None = None
    mutant: str | None = None
    semantics: str | None = None


SCHEMAS = {SUMMARY: Summary, REPLAY_SUMMARY: Summary, MUTANTS: list[MutantRow], CLEAN_REFERENCE: CleanReference,
           TRIAGE: Triage, VERSIONS: Versions, SANITIZER: Sanitizer, KERNEL: Kernel, NIGHTLY: Nightly, CSAN: Csan}
_ADAPTERS = {name: TypeAdapter(kind) for name, kind in SCHEMAS.items()}


# -- reading and writing --------------------------------------------------------------------------------------

def read_report(path: Path) -> Any:
    """The data of a report file, as written, once its file's schema has accepted it; else a ReportError
    naming the file and the first field that is wrong."""
    path = Path(path)
    data = _read_json(path)
    try:
        _ADAPTERS[path.name].validate_python(data, strict=True)
    except ValidationError as exc:
        raise ReportError(f"{path.name}: {_describe(exc)}") from None
    return data


def check_written(name: str, text: str) -> None:
    """`text`, about to be written as the report file `name`, is what the reader accepts, with no field
    its schema does not declare; an UnwritableReport otherwise. Checked on the text itself, as the reader
    will see it (a tuple written is a list read)."""
    try:
        _ADAPTERS[name].validate_python(json.loads(text), strict=True, extra="forbid")
    except ValidationError as exc:
        raise UnwritableReport(f"{name}: {_describe(exc)}") from exc


def _read_json(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path.name}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None


_KINDS = {"int_type": "int", "float_type": "number", "string_type": "str", "bool_type": "bool", "list_type": "a list",
          "dict_type": "an object", "model_type": "an object"}


def _describe(error: ValidationError) -> str:
    """The first error as a person reads it: the field's path in the file (`findings[0].kind`) and what is
    wrong with it."""
    first = error.errors(include_url=False)[0]
    path = _field_path(first["loc"])
    subject = f"field '{path}'" if path else "the top level"
    kind = first["type"]
    if kind == "missing":
        text = f"missing field '{path}'"
    elif kind in _KINDS:
        text = f"{subject} must be {_KINDS[kind]}, got {json.dumps(first['input'])[:60]}"
    elif kind == "literal_error":
        text = f"{subject} is {first['input']!r}; allowed: {first['ctx']['expected']}"
    elif kind == "extra_forbidden":
        text = f"{subject} is not declared in its schema (reports/schema.py)"
    elif kind == SHAPE_ERROR:
        text = f"{subject} {first['msg']}"
    else:
        text = f"{subject}: {first['msg']}"
    more = error.error_count() - 1
    return text + (f" (and {more} more error(s))" if more else "")


def _field_path(loc: tuple) -> str:
    """pydantic's location as the file's path: `('findings', 0, 'kind')` is `findings[0].kind`, a list
    file's `(0, 'killed')` is `[0].killed`; the names of a field's shapes are left out."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in _TAGS:
            path += f".{part}" if path else part
    return path
