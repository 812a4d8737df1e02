"""The fuzz campaign: hypothesis draws cases, every case is judged, a failure shrinks and replays.

Profiles (`harness.choices.PROFILES`): ``dev`` (small, local database), ``ci`` (derandomized: one fixed
stream, `FIXED_STREAM_SEED`, no database, 200 examples), ``nightly`` (large and random). The example
database lives in the report folder, so a nightly failure replays from it; shared databases
(`harness.example_db`) make it replay on other hosts too.

A campaign with a database runs in two passes: first the failures stored in the database, replayed
by every shard; then the case stream, of which a shard (`harness.sharding`) judges only its own
part: the seed cases, the coverage-first cases (`harness.covering`: drawn, each reaching a value of
the coverage table no case before it reached, until every value it can reach is reached), and the
drawn ones. Keeping the replays out of the stream keeps the stream the same for every shard whatever
the database holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import json
import random
import sys
import time
from collections import deque
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence
from unittest import SkipTest

from hypothesis import HealthCheck, Phase, example, given, reject, settings
from hypothesis.internal.conjecture import providers
from hypothesis.internal.conjecture.engine import ConjectureRunner

from harness.case import GRAPH_CONTRACTS
from harness.choices import PROFILES
from harness.coverage import VALUES, Coverage
from harness.covering import FIRST_CASES, CoverageFirst, covering_cases, unreachable
from harness.device import DeviceKind
from harness.engine import CaseResult, Finding, run_case
from harness.errors import HarnessError, InvalidArgument
from harness.example_db import ScopedDatabase, database_scope, open_database
from harness.isolation import IsolatedPool, IsolatedRunner
from harness.overlap import FastPathOverlap
from harness.sharding import WHOLE, Shard
from harness.shrink import shrink_failure
from harness.strategies import PROFILE_BUDGETS, cases, schedules, seed_cases
from harness.targets import REFERENCE, TargetSpec
from harness.validation import check_one_of, check_positive


FIXED_STREAM_SEED = 0  # the `ci` profile's stream (BENCHMARKS.md's kill tables and figures are measured on it)


def keeps_database(profile: str, seed: Optional[int]) -> bool:
    """Whether a campaign keeps an example database: hypothesis derandomizes the `ci` profile, and a
    derandomized run has none, unless an explicit seed makes it random again."""
    return seed is not None or not PROFILES[profile]["derandomize"]


class StreamPhase(str, enum.Enum):
    """Where a counted case comes from (`cases_log`'s `phase`): a failure replayed from the example database (before
    the stream), or the stream's seed cases, coverage-first cases (`harness.covering`), drawn cases."""

    DATABASE = "database"
    SEED = "seed"
    COVERAGE_FIRST = "coverage-first"
    DRAWN = "drawn"


class FindingRaised(AssertionError):
    """Raised inside the hypothesis test so that it shrinks the case; carries the judged result.
    `by_hypothesis`: False when the campaign raises it itself, past hypothesis, which then has not
    shrunk the case."""

    def __init__(self, result: CaseResult, *, by_hypothesis: bool = True):
        first = result.findings[0]
        super().__init__(f"{first.oracle}/{first.kind}: {first.message}\nreplay: {result.replay}")
        self.result, self.by_hypothesis = result, by_hypothesis


class FailureDealt(BaseException):
    """--jobs: raised out of the dealt pass at its first failure in stream order: not an `Exception`,
    so hypothesis stops drawing instead of shrinking the case it drew last."""

    def __init__(self, result, schedule: str):
        super().__init__(result.replay)
        self.result, self.schedule = result, schedule


class EnoughFailures(BaseException):
    """Raised inside the hypothesis test once --keep-going's distinct failures are collected: not an
    `Exception`, so hypothesis stops drawing instead of shrinking it."""


class JudgingFailed(BaseException):
    """Carries a harness error (a broken environment, bad input) raised judging a case inside the hypothesis test:
    not an `Exception`, so hypothesis neither shrinks nor replays that case. A case that ran the device out of memory
    beside three others did not on hypothesis's replay alone, and the campaign ended in hypothesis's `FlakyFailure`
    (exit 5, a traceback) instead of the error (exit 3). `Campaign.run` raises the error itself."""

    def __init__(self, error: HarnessError):
        super().__init__(str(error))
        self.error = error


class CampaignInterrupted(BaseException):
    """Raised inside the hypothesis test when a stop was requested: not an `Exception`, so that
    hypothesis does not take it for a failure to shrink, but stops and lets it through."""


@dataclass
class CampaignResult:
    target: str
    device: str
    semantics: str
    seed: Optional[int]
    profile: str
    cases: int = 0
    duration_s: float = 0.0
    first_detection_examples: Optional[int] = None
    first_detection_seconds: Optional[float] = None
    minimal: Optional[CaseResult] = None
    cases_log: list[dict] = dataclasses.field(default_factory=list)  # one record per counted case, for plots
    # the distinct failures (`failure_signature`) among the counted cases: what the progress line counts, as
    # the end counts the failures it reports (it once counted failing cases: 13 so far, then 7 at the end)
    failure_signatures: set = dataclasses.field(default_factory=set)
    stand_ins: list[dict] = dataclasses.field(default_factory=list)  # the target's stood-in modules, if any
    target_description: str = ""  # what exactly is under test: a package's version and the adapter driving it
    without: list[str] = dataclasses.field(default_factory=list)  # gate switches never drawn (--without, the target's)
    shard: Shard = WHOLE
    interrupted: Optional[str] = None  # the signal that stopped the campaign early
    replayed_from_db: int = 0  # cases of the database pass
    found_on_seed: bool = False  # the first failure came from a seed case (hypothesis cannot shrink those)
    shrunk: bool = False  # the reported case is the shrinker's result, not the case as drawn
    shrink_seconds: Optional[float] = None
    coverage: Coverage = dataclasses.field(default_factory=Coverage)
    failures: list[CaseResult] = dataclasses.field(default_factory=list)  # --keep-going: each distinct one, shrunk
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds, summed over the judged cases
    race_gates: dict[str, int] = dataclasses.field(default_factory=dict)  # CUDA: how the gates opened, counted
    overlap: FastPathOverlap = dataclasses.field(default_factory=FastPathOverlap)  # CUDA: the fast path, in time
    jobs: int = 1  # cases judged at once, each in its own child
    waited_s: float = 0.0  # --jobs: the seconds this process waited for its children's cases

    def add_phases(self, judged) -> None:
        """What a judged case adds to the campaign's figures (also one tried while shrinking: it took the time and
        ran on the device): its phases' seconds, how its race gates opened, its batches' measured overlap."""
        for name, seconds in judged.phases().items():
            self.phases[name] = self.phases.get(name, 0.0) + seconds
        for way in judged.gate_openings():
            self.race_gates[way] = self.race_gates.get(way, 0) + 1
        self.overlap.add(judged.batch_overlaps())

    def time_breakdown(self) -> dict[str, float]:
        """Where the campaign's `duration_s` went: each judged case's phases (`findings.PHASES`, and
        `isolation` for a case judged in a child), and `campaign`: drawing the cases, the database,
        shrinking's bookkeeping. With --jobs the phases are summed over the children judging at once,
        and `campaign` is the time this process did not wait for them."""
        spent = {name: round(seconds, 3) for name, seconds in self.phases.items()}
        judging = self.waited_s if self.jobs > 1 else sum(self.phases.values())
        return {**spent, "campaign": round(max(0.0, self.duration_s - judging), 3)}

    @property
    def findings(self) -> list[Finding]:
        return self.minimal.findings if self.minimal else []

    def summary(self) -> dict:
        failures = self.failures or ([self.minimal] if self.minimal else [])
        return {
            "target": self.target, "device": self.device, "semantics": self.semantics, "seed": self.seed,
            "profile": self.profile, "cases": self.cases, "duration_s": round(self.duration_s, 3),
            "cases_per_second": round(self.cases / self.duration_s, 2) if self.duration_s else None,
            "first_detection": None if self.first_detection_examples is None else {
                "examples": self.first_detection_examples, "seconds": round(self.first_detection_seconds, 3)},
            "findings": [
                {**dataclasses.asdict(f), "case": json.loads(failure.case.to_json()),
                 "case_summary": failure.case.summary(), "replay": failure.replay}
                for failure in failures for f in failure.findings
            ],
            "cases_log": self.cases_log,
            "stand_ins": self.stand_ins,
            "target_description": self.target_description,
            "without": self.without,
            "shard": self.shard.to_dict(),
            "interrupted": self.interrupted,
            "replayed_from_db": self.replayed_from_db,
            "found_on_seed": self.found_on_seed,
            "shrunk": self.shrunk,
            "shrink_seconds": None if self.shrink_seconds is None else round(self.shrink_seconds, 3),
            "coverage": self.coverage.to_dict(),
            "time": self.time_breakdown(),
            "race_gates": dict(self.race_gates),
            "fast_path_overlap": self.overlap.to_dict(timed=DeviceKind(self.device).real_concurrency),
            "jobs": self.jobs,
        }


@dataclass(frozen=True)
class CampaignConfig:
    """What a campaign runs, made once from the options and checked as it is made, so that no layer
    below checks it again. The names are the library's: a bad value is refused naming the field, and
    the command line checks its flags before it builds one (`harness.commands.run`).

    `target_spec`: the target the campaign's cases name, in their replay commands, to an isolated child and in
    the example database's scope (`Campaign` is given the target itself, loaded from it).
    `seeds`: start from one case of each protocol shape (`strategies.seed_cases`), then draw.
    `from_db`: replay only the failures stored in the example database, then the seeds.
    `isolate_s`: judge each case in a child process with this timeout, so a case that kills the CUDA
    context or hangs is a finding with its replay command, not the end of the run.
    `shard`: judge only this part of the case stream (the database pass is replayed whole).
    `shared_databases`: database specs (a directory or redis://HOST:PORT) combined with `database_dir` (`harness.example_db`).
    `keep_going`: collect up to this many distinct failures (`failure_signature`) before stopping,
    each shrunk afterwards by `harness.shrink` (1: stop at the first, shrunk by hypothesis).
    `jobs`: judge up to this many cases at once, each in its own child (needs `isolate_s`); the stream,
    the count, the first detection and the shrunk case are those of one case at a time."""

    target_spec: TargetSpec = REFERENCE
    device: DeviceKind = DeviceKind.CPU
    semantics: str = "0.5.23"
    examples: Optional[int] = None
    seed: Optional[int] = None
    profile: str = "ci"
    database_dir: Optional[Path] = None
    shrink: bool = True
    oracles: Optional[frozenset] = None
    shrink_seconds: float = 30.0
    seeds: bool = True
    from_db: bool = False
    isolate_s: Optional[float] = None
    shard: Shard = WHOLE
    shared_databases: tuple[str, ...] = ()
    keep_going: int = 1
    jobs: int = 1
    without: frozenset[str] = frozenset()

    def __post_init__(self):
        object.__setattr__(self, "shared_databases", tuple(self.shared_databases))  # frozen: no list shared
        object.__setattr__(self, "without", frozenset(self.without))
        check_one_of(self.profile, PROFILES, "profile")
        check_one_of(self.device, [kind.value for kind in DeviceKind], "device")
        object.__setattr__(self, "device", DeviceKind(self.device))
        if self.examples is not None:
            check_positive(self.examples, "examples")
        check_positive(self.keep_going, "keep_going")
        check_positive(self.jobs, "jobs")
        if self.jobs > 1 and not self.isolate_s:
            raise InvalidArgument(f"jobs={self.jobs}: cases judged at once are each judged in a child process; "
                                  f"isolate_s={self.isolate_s!r} leaves none")
        if self.derandomized and (self.from_db or self.shared_databases):
            name = "from_db" if self.from_db else "shared_databases"
            raise InvalidArgument(f"{name}: the {self.profile!r} profile is derandomized and keeps no example "
                                  "database (dev and nightly do, and so does any profile with a seed)")
        if self.from_db and self.database_dir is None and not self.shared_databases:
            raise InvalidArgument("from_db: no example database to replay from (no database_dir, no shared_databases)")

    @property
    def derandomized(self) -> bool:
        """Whether hypothesis draws the profile's fixed stream, and keeps no example database."""
        return not keeps_database(self.profile, self.seed)

    @property
    def stream_seed(self) -> Optional[int]:
        """The seed of the case stream: the one given; a derandomized profile's fixed one (every campaign of the
        profile draws the same stream whatever its target, mutant or device, so a kill table judges each mutant
        on the clean campaign's cases, and no edit of the harness's code moves it); or None, a random stream."""
        if self.seed is not None:
            return self.seed
        return FIXED_STREAM_SEED if self.derandomized else None

    @property
    def max_examples(self) -> int:
        """The cases in all: the seeds count as examples, so `examples` N runs N cases."""
        return self.examples if self.examples is not None else PROFILES[self.profile]["max_examples"]

    def with_fixed_stream(self) -> CampaignConfig:
        """This config with a seed drawn now (and recorded) if its profile is random and has none: the
        stream is then drawn again alike, by a failure's replay, by the dealt pass or by workers."""
        if self.seed is not None or PROFILES[self.profile]["derandomize"]:
            return self
        return dataclasses.replace(self, seed=random.getrandbits(32))


@dataclass(frozen=True)
class StreamPlan:
    """The case stream's parts, fixed before its first case: the seed cases, how many cases the
    coverage-first phase may keep, and the gate switches and coverage values the target leaves out."""

    seeds: tuple
    drawn_examples: int  # the examples hypothesis draws after the seeds
    first_cases: int  # the coverage-first phase's most: the drawn cases keep one
    reachable: tuple
    unreachable: frozenset
    without: frozenset[str]  # the config's and the target's (`cannot_run`)
    dims: tuple
    contracts: object
    uniform_draft_width: bool  # the target's (`Target.uniform_draft_width`)

    @classmethod
    def of(cls, target, config: CampaignConfig) -> StreamPlan:
        dims = tuple(sorted(getattr(target, "fixed_dims", {}).items()))
        contracts = getattr(target, "graph_contracts", GRAPH_CONTRACTS)
        cannot_run = getattr(target, "cannot_run", frozenset())
        impossible = unreachable(without=config.without, cannot_run=cannot_run, contracts=contracts)
        without = config.without | cannot_run
        seeds = (tuple(seed_cases(config.semantics, without, dims, contracts)[: max(0, config.max_examples - 1)])
                 if config.seeds else ())
        drawn = config.max_examples - len(seeds)
        return cls(seeds=seeds, drawn_examples=drawn, first_cases=min(FIRST_CASES, drawn - 1),
                   reachable=tuple(value for value in VALUES if value not in impossible), unreachable=impossible,
                   without=without, dims=dims, contracts=contracts,
                   uniform_draft_width=getattr(target, "uniform_draft_width", False))


def run_campaign(target, *, on_case: Callable[[CampaignResult], None] = lambda r: None,
                 should_stop: Callable[[], Optional[str]] = lambda: None, **options) -> CampaignResult:
    """The campaign of `CampaignConfig(**options)` against `target`, in one call (tests, the kill table)."""
    return Campaign(target, CampaignConfig(**options), on_case=on_case, should_stop=should_stop).run()


class Campaign:
    """One campaign against `target`: the database pass, then the case stream (dealt to children with
    `jobs` > 1, `DealtPass`), then the shrinking. `on_case(result)` after each counted case;
    `should_stop()` is polled before each case: a reason (a signal's name) ends the campaign early with
    what it has, marked `interrupted`."""

    def __init__(self, target, config: CampaignConfig, *,
                 on_case: Callable[[CampaignResult], None] = lambda r: None,
                 should_stop: Callable[[], Optional[str]] = lambda: None):
        self.config = config.with_fixed_stream() if config.jobs > 1 else config
        config = self.config
        self.target, self.on_case, self.should_stop = target, on_case, should_stop
        self.plan = StreamPlan.of(target, config)
        self.db = None if config.derandomized else open_database(config.database_dir, config.shared_databases)
        self.result = CampaignResult(
            target=config.target_spec.spec, device=config.device, semantics=config.semantics, seed=config.seed,
            profile=config.profile, shard=config.shard, stand_ins=list(getattr(target, "stand_ins", [])),
            jobs=config.jobs, target_description=getattr(target, "description", ""),
            without=sorted(self.plan.without), coverage=Coverage(unreachable=self.plan.unreachable))
        self.start = time.perf_counter()
        self.runner = None
        if config.isolate_s:
            self.runner = (IsolatedPool(config.jobs, timeout_s=config.isolate_s) if config.jobs > 1
                           else IsolatedRunner(timeout_s=config.isolate_s))
        judge = self.runner.run_case if self.runner else functools.partial(run_case, target)
        self._judge = _timed(judge, self.result) if config.jobs > 1 else judge
        self.case_options = dict(target_spec=config.target_spec, oracles=config.oracles)
        strategy_options = dict(budget=PROFILE_BUDGETS[config.profile], dims=self.plan.dims,
                                contracts=self.plan.contracts, uniform_draft_width=self.plan.uniform_draft_width)
        self.cases_drawn = cases(config.semantics, without=self.plan.without, **strategy_options)
        self.cases_covering = covering_cases(config.semantics, reachable=self.plan.reachable, without=self.plan.without,
                                             **strategy_options)
        self.failing: dict[tuple[str, str], CaseResult] = {}  # the failures judged, which hypothesis replays
        self.collected: dict[tuple, tuple[CaseResult, str]] = {}  # keep_going: signature -> (failure, its schedule)
        self.stream_position = 0  # cases of the partitioned pass met before the first detection
        self.replaying_to: Optional[tuple[str, str]] = None  # jobs: the failure the replay of the stream stops at
        self.shrink_from = 0.0  # when the shrinking began (perf_counter)
        self.first = CoverageFirst(frozenset(self.plan.reachable))  # the coverage-first phase of `run_stream`'s run

    def run(self) -> CampaignResult:
        """The passes, then the shrinking of what they found; the children are closed whatever happens."""
        main_phases = [Phase.explicit] if self.config.from_db else [Phase.explicit, Phase.generate, Phase.target]
        try:
            try:
                if self.db is not None:
                    self.database_pass()
                if self.config.jobs > 1:
                    DealtPass(self).run(main_phases)
                else:
                    self.run_stream(main_phases)
            except FindingRaised as raised:
                self.keep_minimal(raised)
            except (CampaignInterrupted, EnoughFailures):
                pass
            except JudgingFailed as failed:
                raise failed.error from None
            if self.collected:
                self.shrink_collected()
        finally:
            if self.runner:
                self.runner.close()
        self.result.duration_s = time.perf_counter() - self.start
        return self.result

    def judge(self, case, schedule: str) -> CaseResult:
        """`case` judged under `schedule`, in this process or in a child (`isolate_s`)."""
        return self._judge(case, self.config.device, schedule=schedule, **self.case_options)

    def next_position(self) -> int:
        """The position in the stream of the case met now, the stream advanced past it."""
        position, self.stream_position = self.stream_position, self.stream_position + 1
        return position

    def stop_requested(self) -> Optional[str]:
        """The reason to stop, if one was given since the last case; the result is marked with it."""
        reason = self.should_stop()
        if reason:
            self.result.interrupted = reason
        return reason

    def count(self, case, schedule, judged, position: Optional[int], *, partitioned: bool) -> None:
        """One case of the campaign counted, in stream order (not one tried while shrinking)."""
        result = self.result
        result.cases += 1
        if not partitioned:
            result.replayed_from_db += 1
        result.cases_log.append({**_case_record(result.cases, time.perf_counter() - self.start, case, schedule,
                                                judged, position), "phase": self.stream_phase(position)})
        result.coverage.add(case, position)
        if judged.findings:
            result.failure_signatures.add(failure_signature(judged))
        self.on_case(result)
        if judged.findings and result.first_detection_seconds is None:
            result.first_detection_examples = result.cases
            result.first_detection_seconds = time.perf_counter() - self.start
            result.found_on_seed = partitioned and case in self.plan.seeds
            self.shrink_from = time.perf_counter()
        if judged.findings and self.config.keep_going > 1:
            self.collected.setdefault(failure_signature(judged), (judged, schedule))
            if len(self.collected) >= self.config.keep_going:
                raise EnoughFailures()

    def campaign_case(self, case, schedule, *, partitioned: bool) -> None:
        """One case hypothesis met: of the stream (judged and counted, if this shard's), replayed from the
        database, or tried while shrinking (judged within the shrink budget, not counted)."""
        key = (case.to_json(), schedule)
        if self.replaying_to is not None:
            if key != self.replaying_to:
                return  # the dealt pass judged and counted this case (clean), or it is another shard's
            self.replaying_to, self.shrink_from = None, time.perf_counter()  # hypothesis shrinks from here
        judged = self.failing.get(key)  # hypothesis replays its minimal example at the end
        if judged is None:
            detected = self.result.first_detection_seconds is not None and self.config.keep_going == 1
            reason = self.stop_requested()
            if reason and not detected:
                raise CampaignInterrupted(reason)
            if reason or (detected and time.perf_counter() - self.shrink_from > self.config.shrink_seconds):
                return  # stopped, or the shrink budget is spent: keep the smallest failure found so far
            position = self.stream_position if partitioned else None
            if partitioned and not detected and not self.config.shard.owns(self.next_position()):
                return  # another shard's case
            judged = self.judge(case, schedule)
            self.result.add_phases(judged)
            if not detected:
                self.count(case, schedule, judged, position, partitioned=partitioned)
                if self.config.keep_going > 1:
                    return  # keep drawing: the next distinct failure may be elsewhere
        if judged.findings:
            self.failing[key] = judged
            raise FindingRaised(judged)

    def stream_phase(self, position: Optional[int]) -> StreamPhase:
        """The part of the stream a counted case belongs to: the seed cases, then the coverage-first phase's."""
        if position is None:
            return StreamPhase.DATABASE
        if position < len(self.plan.seeds):
            return StreamPhase.SEED
        return (StreamPhase.COVERAGE_FIRST if position < len(self.plan.seeds) + self.first.cases
                else StreamPhase.DRAWN)

    def drawing(self) -> bool:
        """Whether a case met now is the stream's next one: not one hypothesis tries while shrinking a failure."""
        return (self.replaying_to is not None or self.result.first_detection_seconds is None
                or self.config.keep_going > 1)

    def covering_case(self, case, schedule, *, partitioned: bool, handle) -> None:
        """A case of the coverage-first phase: the stream keeps it only if it reaches a value no case before it
        reached (hypothesis draws another instead). Once every reachable value is reached the phase is over: the
        draws left of its examples are neither kept nor judged (raising to stop hypothesis would store the draw in
        the example database, as it stores any example that raises). A failure replayed from the database (not
        `partitioned`) or shrunk is judged as it is."""
        if not (partitioned and self.drawing()):
            handle(case, schedule, partitioned=partitioned)
            return
        if self.first.complete:
            return
        if not self.first.keeps(case, schedule):
            reject()
        handle(case, schedule, partitioned=partitioned)
        self.first.mark_judged(case, schedule)

    def drawn_case(self, case, schedule, *, handle) -> None:
        """A case drawn after the coverage-first phase; one the phase judged already is drawn again: hypothesis
        draws each test's simplest case first, and the simplest drawn case is also the simplest one aimed at the
        table's first value (an EXTEND batch)."""
        if self.drawing() and (case.to_json(), schedule) in self.first.kept:
            reject()
        handle(case, schedule, partitioned=True)

    def hypothesis_test(self, phases, strategy, body, *, examples: int, part: str = "", explicit: Sequence = (),
                        shrinks: bool = True):
        """`body(case, schedule)` on the cases of `strategy`, drawn from the config's stream seed; `part` keeps the
        coverage-first phase's failures apart from the drawn ones' in the example database."""
        config = self.config
        hypothesis_shrinks = shrinks and config.shrink and config.keep_going == 1  # keep_going's: shrunk afterwards
        database = None if self.db is None else ScopedDatabase(self.db, database_scope(
            target_spec=config.target_spec.spec, mutant=config.target_spec.mutant, semantics=config.semantics,
            device=config.device) + part.encode())
        schedule = schedule_strategy(config.device)

        @settings(deadline=None, database=database, phases=phases + ([Phase.shrink] if hypothesis_shrinks else []),
                  print_blob=False, suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  max_examples=examples)
        @given(case=strategy, schedule=schedule)
        def test(case, schedule):
            try:
                body(case, schedule)
            except HarnessError as exc:
                raise JudgingFailed(exc) from exc

        for case in reversed(explicit):
            test = example(case=case, schedule="adversarial")(test)
        return _seeded(test, config.stream_seed) if config.stream_seed is not None else test

    def run_stream(self, phases, *, handle=None, shrinks: bool = True) -> None:
        """The case stream, from its start: the seed cases (`Phase.explicit`), the coverage-first cases, the drawn
        ones. The coverage-first phase starts from what the seeds reach, and how many cases it keeps sets how many
        are drawn after it. `handle`: what each case of the stream is given to (`campaign_case`)."""
        handle = handle or self.campaign_case
        plan = self.plan
        self.first = CoverageFirst(frozenset(plan.reachable))
        for case in plan.seeds:
            self.first.add(case)
        drawn_phases = [phase for phase in phases if phase is not Phase.explicit]
        with pinned_stream():
            if plan.seeds and Phase.explicit in phases:
                self.hypothesis_test([Phase.explicit], self.cases_drawn, functools.partial(handle, partitioned=True),
                                     examples=1, explicit=plan.seeds, shrinks=shrinks)()
            if not drawn_phases:
                return
            if plan.first_cases > 0 and not self.first.complete:
                self.hypothesis_test(drawn_phases, self.cases_covering,
                                     functools.partial(self.covering_case, partitioned=True, handle=handle),
                                     examples=plan.first_cases, part=";coverage-first", shrinks=shrinks)()
            self.hypothesis_test(drawn_phases, self.cases_drawn, functools.partial(self.drawn_case, handle=handle),
                                 examples=plan.drawn_examples - self.first.cases, shrinks=shrinks)()

    def database_pass(self) -> None:
        """The failures stored in the example database, of the coverage-first phase and of the drawn cases; none
        is part of the stream."""
        with pinned_stream():
            for strategy, body, part in (
                    (self.cases_covering,
                     functools.partial(self.covering_case, partitioned=False, handle=self.campaign_case),
                     ";coverage-first"),
                    (self.cases_drawn, functools.partial(self.campaign_case, partitioned=False), "")):
                with contextlib.suppress(SkipTest):  # nothing stored for this part
                    self.hypothesis_test([Phase.reuse], strategy, body, examples=self.plan.drawn_examples,
                                         part=part)()

    def keep_minimal(self, raised: FindingRaised) -> None:
        """The failure the passes ended at, shrunk here if hypothesis could not: a seed case's, or one the
        replay of the dealt stream did not meet."""
        result = self.result
        result.minimal = raised.result
        shrink = self.config.shrink and not result.interrupted
        if shrink and (result.found_on_seed or not raised.by_hypothesis):
            result.minimal = shrink_failure(lambda c: self.judge(c, "adversarial"), raised.result,
                                            budget_s=self.config.shrink_seconds)
        if shrink:
            result.shrunk = True
            result.shrink_seconds = time.perf_counter() - self.start - result.first_detection_seconds

    def shrink_collected(self) -> None:
        """Each of keep_going's failures, shrunk under its own schedule policy, `shrink_seconds` each."""
        result = self.result
        shrink = self.config.shrink and not result.interrupted
        began = time.perf_counter()
        for failure, schedule in self.collected.values():
            if shrink:
                failure = shrink_failure(lambda c, schedule=schedule: self.judge(c, schedule), failure,
                                         budget_s=self.config.shrink_seconds)
            result.failures.append(failure)
        result.minimal = result.failures[0]
        result.shrunk = shrink
        result.shrink_seconds = time.perf_counter() - began if shrink else None


class DealtPass:
    """`jobs` > 1: the case stream dealt to the children, counted in stream order. At its first failure
    the stream is drawn again, one case at a time and judging none, up to that case, where the failure
    is raised inside hypothesis, which shrinks it as a campaign judging one case at a time would (the
    same seed draws the same stream)."""

    def __init__(self, campaign: Campaign):
        self.campaign = campaign
        self.dealt: deque = deque()  # (position, case, schedule, future) of the cases dealt and not yet counted

    def run(self, phases) -> None:
        try:
            try:
                self.campaign.run_stream(phases, handle=self.deal, shrinks=False)
            except CampaignInterrupted:
                self.settle(every_case=True)  # the cases in flight finish and count, as the one in flight does
                raise
            self.settle(every_case=True)
        except FailureDealt as stopped:
            self.replay_to(phases, stopped.result, stopped.schedule)

    def deal(self, case, schedule, *, partitioned: bool) -> None:
        """The stream's case handed to a free child; the ones judged so far counted in order."""
        campaign = self.campaign
        reason = campaign.stop_requested()
        if reason:
            raise CampaignInterrupted(reason)
        position = campaign.next_position()
        if campaign.config.shard.owns(position):
            future = campaign.runner.submit(case, campaign.config.device, schedule=schedule, **campaign.case_options)
            self.dealt.append((position, case, schedule, future))
        self.settle(every_case=False)

    def settle(self, *, every_case: bool) -> None:
        """Counts the dealt cases judged so far, in stream order, so that the count, the log and the first
        detection are those of a campaign judging one case at a time. Waits while `jobs` cases are being
        judged, or with `every_case` until every dealt case is counted. A failure (keep_going 1) ends the
        pass: `FailureDealt`."""
        campaign = self.campaign
        while self.dealt:
            position, case, schedule, future = self.dealt[0]
            if not future.done():
                running = [entry[3] for entry in self.dealt if not entry[3].done()]
                if not every_case and len(running) < campaign.config.jobs:
                    return
                began = time.perf_counter()
                futures.wait(running, return_when=futures.FIRST_COMPLETED)
                campaign.result.waited_s += time.perf_counter() - began
                continue
            self.dealt.popleft()
            judged = future.result()
            campaign.result.add_phases(judged)
            campaign.count(case, schedule, judged, position, partitioned=True)
            if judged.findings and campaign.config.keep_going == 1:
                raise FailureDealt(judged, schedule)

    def replay_to(self, phases, failure: CaseResult, schedule: str) -> None:
        """The stream drawn again up to `failure`, for hypothesis to shrink it there; a seed's failure, or
        one without shrinking, is raised as it is (a seed's is shrunk by `Campaign.keep_minimal`)."""
        campaign = self.campaign
        key = (failure.case.to_json(), schedule)
        campaign.failing[key] = failure
        if not campaign.config.shrink or campaign.result.found_on_seed or campaign.result.interrupted:
            raise FindingRaised(failure)
        campaign.replaying_to = key
        campaign.run_stream(phases)
        print(f"warning: the replay of the stream did not meet its failing case {case_digest(failure.case, schedule)}: "
              "shrunk greedily instead of by hypothesis", file=sys.stderr)
        raise FindingRaised(failure, by_hypothesis=False)



def _timed(judge, result: CampaignResult):
    """`judge`, adding the seconds this process waits for it to `result.waited_s`."""
    def timed(*args, **kwargs):
        began = time.perf_counter()
        try:
            return judge(*args, **kwargs)
        finally:
            result.waited_s += time.perf_counter() - began
    return timed


def failure_signature(judged: CaseResult) -> tuple:
    """Failures are distinct by oracle, kind and location (the buffer or tensor, else the batch)."""
    first = judged.findings[0]
    return first.oracle, first.kind, first.details.get("buffer") or first.details.get("tensor") or first.batch


@contextlib.contextmanager
def pinned_stream():
    """A campaign's case stream as a function of its strategies, its seed and hypothesis alone, every
    example a fresh draw. Two of hypothesis's generation heuristics are switched off while it runs:

    - the duplication mutator (`ConjectureRunner.generate_mutations_from`): after each fresh example it
      runs up to five variants that copy one span of its choices over another of the same label,
      keeping the example's other choices. That is cheap diversity for a test of microseconds; a case
      here costs up to a second, and the variants keep the case's shape: of 60 examples of the `ci`
      stream, 38 had distinct shapes (spec, flags, each batch's mode, graph and requests), 60 with it
      off. Our strategies draw the duplication that matters themselves (a later batch over the first
      batch's requests).
    - the local constants (`providers._get_local_constants`): hypothesis mixes numbers and strings
      found in the loaded modules of this repository into its draws, so any edit of the harness's code,
      or which of its modules a process has imported (the sglang target's, a worker's), moved the
      stream of a seed: a shard on another host, or the same seed after an unrelated commit, judged
      other cases. Hypothesis's own constants (boundaries, special floats) stay.

    Shrinking and the database are unchanged. tests/test_fuzzing.py fails if hypothesis renames either.
    """
    original_mutations = ConjectureRunner.generate_mutations_from
    original_constants = providers._get_local_constants
    ConjectureRunner.generate_mutations_from = _no_mutations
    providers._get_local_constants = _no_local_constants
    providers.CONSTANTS_CACHE.cache.clear()  # the allowed constants of each choice, local ones included
    try:
        yield
    finally:
        ConjectureRunner.generate_mutations_from = original_mutations
        providers._get_local_constants = original_constants
        providers.CONSTANTS_CACHE.cache.clear()


def _no_mutations(runner: ConjectureRunner, data) -> None:
    """`generate_mutations_from` that runs none: the next example is drawn afresh."""


_NO_CONSTANTS = providers.Constants()


def _no_local_constants() -> "providers.Constants":
    """`_get_local_constants` that finds none in this repository's modules."""
    return _NO_CONSTANTS


def case_digest(case, schedule: str) -> str:
    """A short name for one drawn case and schedule: shards and merges compare case sets by it."""
    return hashlib.sha256(f"{case.to_json()}|{schedule}".encode()).hexdigest()[:16]


def _case_record(i: int, seconds: float, case, schedule: str, judged: CaseResult, position: Optional[int]) -> dict:
    """`stream`: the case's position in the case stream (None: replayed from the database)."""
    return {"i": i, "t": round(seconds, 4), "outcome": "found" if judged.findings else "clean",
            "stream": position, "case": case_digest(case, schedule),
            "tokens": sum(b.num_tokens for b in case.batches),
            "requests": sum(len(b.requests) for b in case.batches),
            "graph": any(b.graph for b in case.batches), "spec": case.spec.name}


def schedule_strategy(device: DeviceKind):
    """Each example's schedule: drawn on the simulator (`schedules`); on a device that runs truly concurrently,
    always `adversarial` (the GPU orders what it runs), drawn all the same and then replaced, so that a seed's case
    stream is the same on every device (a draw of nothing would shift every later case's choices: a case the CPU
    stream found would not be in the CUDA stream of the same seed)."""
    if device.real_concurrency:
        return schedules().map(lambda _: "adversarial")
    return schedules()


def _seeded(test, seed: int):
    """The case stream of `seed`, with the example database kept.

    Hypothesis's own `@seed(n)` sets this same attribute and also turns the database off: it is meant
    for reproducing one run. A campaign needs both: the seed fixes the stream that shards and
    workers partition, and the database keeps the failures found in it, for `--from-db` on every host.
    The tests in tests/test_sharding.py and tests/test_example_db.py fail if hypothesis changes this.
    """
    test._hypothesis_internal_use_seed = seed
    return test
