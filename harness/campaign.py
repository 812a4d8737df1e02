"""The fuzz campaign: hypothesis draws cases, every case is judged, a failure shrinks and replays.

Profiles (`settings.register_profile`): ``dev`` (small, local database), ``ci`` (derandomized, no
deadline, 200 examples), ``nightly`` (large and random). The example database lives in the report
folder, so a nightly failure replays from it; shared databases (`harness.example_db`) make it replay
on other hosts too.

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
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers
from hypothesis.internal.conjecture.engine import ConjectureRunner

from harness.case import GRAPH_CONTRACTS
from harness.choices import PROFILES
from harness.coverage import VALUES, Coverage
from harness.covering import FIRST_CASES, CoverageFirst, covering_cases, unreachable
from harness.engine import CaseResult, Finding, run_case
from harness.errors import InvalidArgument
from harness.example_db import database_scope, open_database
from harness.isolation import IsolatedPool, IsolatedRunner
from harness.sharding import WHOLE, Shard
from harness.shrink import shrink_failure
from harness.strategies import PROFILE_BUDGETS, cases, schedules, seed_cases



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
    jobs: int = 1  # cases judged at once, each in its own child
    waited_s: float = 0.0  # --jobs: the seconds this process waited for its children's cases

    def add_phases(self, judged) -> None:
        for name, seconds in judged.phases().items():
            self.phases[name] = self.phases.get(name, 0.0) + seconds
        for way in judged.gate_openings():
            self.race_gates[way] = self.race_gates.get(way, 0) + 1

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
            "jobs": self.jobs,
        }


def run_campaign(target, *, target_spec: str = "reference", device: str = "cpu", semantics: str = "0.5.23",
                 examples: Optional[int] = None, seed: Optional[int] = None, profile: str = "ci",
                 database_dir: Optional[Path] = None, mutant: Optional[str] = None,
                 on_case: Callable[[CampaignResult], None] = lambda r: None, shrink: bool = True,
                 oracles: Optional[frozenset] = None, shrink_seconds: float = 30.0,
                 seeds: bool = True, from_db: bool = False, isolate_s: Optional[float] = None,
                 shard: Shard = WHOLE, shared_databases: Sequence[str] = (),
                 should_stop: Callable[[], Optional[str]] = lambda: None, keep_going: int = 1,
                 jobs: int = 1, without: frozenset[str] = frozenset()) -> CampaignResult:
    """`seeds`: start from one case of each protocol shape (`strategies.seed_cases`), then draw.
    `from_db`: replay only the failures stored in the example database, then the seeds.
    `isolate_s`: judge each case in a child process with this timeout, so a case that kills the CUDA
    context or hangs is a finding with its replay command, not the end of the run.
    `shard`: judge only this part of the case stream (the database pass is replayed whole).
    `shared_databases`: --example-db specs combined with `database_dir` (`harness.example_db`).
    `should_stop`: polled before each case; a reason (a signal's name) ends the campaign early with
    what it has, marked `interrupted`.
    `keep_going`: collect up to this many distinct failures (`failure_signature`) before stopping,
    each shrunk afterwards by `harness.shrink` (1: stop at the first, shrunk by hypothesis).
    `jobs`: judge up to this many cases at once, each in its own child (needs `isolate_s`); the stream,
    the count, the first detection and the shrunk case are those of one case at a time. A random
    profile without a seed gets one drawn here (recorded), as the failure's replay redraws the stream."""
    if profile not in PROFILES:
        raise InvalidArgument(f"--profile={profile!r} is not one of: {', '.join(PROFILES)}")
    if examples is not None and examples < 1:
        raise InvalidArgument(f"--examples={examples}: must be >= 1")
    if keep_going < 1:
        raise InvalidArgument(f"--keep-going={keep_going}: must be >= 1 (the number of distinct failures to collect)")
    check_jobs(jobs, isolate_s)
    base = dict(PROFILES[profile])
    if jobs > 1 and seed is None and not base["derandomize"]:
        seed = random.getrandbits(32)
    if examples is not None:
        base["max_examples"] = examples
    if seed is not None:
        base["derandomize"] = False  # an explicit seed replaces the profile's fixed one
    if base["derandomize"] and (from_db or shared_databases):
        flag = "--from-db" if from_db else "--example-db"
        raise InvalidArgument(f"{flag}: the {profile!r} profile is derandomized and keeps no example database (dev and "
                              "nightly do, and so does any profile with --seed)")
    # The seeds count as examples: --examples N runs N cases in all.
    dims = tuple(sorted(getattr(target, "fixed_dims", {}).items()))
    contracts = getattr(target, "graph_contracts", GRAPH_CONTRACTS)
    cannot_run = getattr(target, "cannot_run", frozenset())
    impossible = unreachable(without=without, cannot_run=cannot_run, contracts=contracts)
    reachable = tuple(value for value in VALUES if value not in impossible)
    without = without | cannot_run
    chosen_seeds = (seed_cases(semantics, without, dims, contracts)[: max(0, base["max_examples"] - 1)]
                    if seeds else [])
    base["max_examples"] -= len(chosen_seeds)
    first_cases = min(FIRST_CASES, base["max_examples"] - 1)  # the coverage-first phase's most: the drawn cases keep one
    db = None if base["derandomize"] else open_database(database_dir, shared_databases)
    if from_db and db is None:
        raise InvalidArgument("--from-db: no example database to replay from (no report folder, no --example-db)")
    result = CampaignResult(target=target_spec, device=device, semantics=semantics, seed=seed, profile=profile,
                            shard=shard, stand_ins=list(getattr(target, "stand_ins", [])), jobs=jobs,
                            target_description=getattr(target, "description", ""), without=sorted(without),
                            coverage=Coverage(unreachable=impossible))
    start = time.perf_counter()

    failing: dict[tuple[str, str], CaseResult] = {}
    runner = None
    if isolate_s:
        runner = IsolatedPool(jobs, timeout_s=isolate_s) if jobs > 1 else IsolatedRunner(timeout_s=isolate_s)
    judge = runner.run_case if runner else functools.partial(run_case, target)
    if jobs > 1:
        judge = _timed(judge, result)
    stream_position = 0  # calls of the partitioned pass before the first detection
    collected: dict[tuple, tuple[CaseResult, str]] = {}  # --keep-going: signature -> (failure, its schedule)
    dealt: deque = deque()  # --jobs: (position, case, schedule, future) of the cases dealt and not yet counted
    replaying_to: Optional[tuple[str, str]] = None  # --jobs: the failure the replay of the stream stops at
    shrink_from = 0.0  # when the shrinking began (perf_counter)
    first = CoverageFirst(frozenset(reachable))  # the coverage-first phase of the stream's current run (`run_stream`)

    def count(case, schedule, judged, position: Optional[int], *, partitioned: bool) -> None:
        """One case of the campaign counted, in stream order (not one tried while shrinking)."""
        nonlocal shrink_from
        result.cases += 1
        if not partitioned:
            result.replayed_from_db += 1
        result.cases_log.append({**_case_record(result.cases, time.perf_counter() - start, case, schedule, judged,
                                                position), "phase": stream_phase(position)})
        result.coverage.add(case, position)
        if judged.findings:
            result.failure_signatures.add(failure_signature(judged))
        on_case(result)
        if judged.findings and result.first_detection_seconds is None:
            result.first_detection_examples = result.cases
            result.first_detection_seconds = time.perf_counter() - start
            result.found_on_seed = partitioned and case in chosen_seeds
            shrink_from = time.perf_counter()
        if judged.findings and keep_going > 1:
            collected.setdefault(failure_signature(judged), (judged, schedule))
            if len(collected) >= keep_going:
                raise EnoughFailures()

    def campaign_case(case, schedule, *, partitioned: bool):
        nonlocal stream_position, replaying_to, shrink_from
        key = (case.to_json(), schedule)
        if replaying_to is not None:
            if key != replaying_to:
                return  # the dealt pass judged and counted this case (clean), or it is another shard's
            replaying_to, shrink_from = None, time.perf_counter()  # hypothesis shrinks from here
        judged = failing.get(key)  # hypothesis replays its minimal example at the end
        if judged is None:
            detected = result.first_detection_seconds is not None and keep_going == 1
            reason = should_stop()
            if reason:
                result.interrupted = reason
                if not detected:
                    raise CampaignInterrupted(reason)
            if reason or (detected and time.perf_counter() - shrink_from > shrink_seconds):
                return  # stopped, or the shrink budget is spent: keep the smallest failure found so far
            position = stream_position if partitioned else None
            if partitioned and not detected:
                stream_position += 1
                if not shard.owns(position):
                    return  # another shard's case
            judged = judge(case, device, schedule=schedule, target_spec=target_spec, mutant=mutant, oracles=oracles)
            result.add_phases(judged)
            if not detected:
                count(case, schedule, judged, position, partitioned=partitioned)
                if keep_going > 1:
                    return  # keep drawing: the next distinct failure may be elsewhere
        if judged.findings:
            failing[key] = judged
            raise FindingRaised(judged)

    def deal(case, schedule, *, partitioned: bool):
        """--jobs: the stream's case handed to a free child; the ones judged so far counted in order."""
        nonlocal stream_position
        reason = should_stop()
        if reason:
            result.interrupted = reason
            raise CampaignInterrupted(reason)
        position, stream_position = stream_position, stream_position + 1
        if shard.owns(position):
            future = runner.submit(case, device, schedule=schedule, target_spec=target_spec, mutant=mutant,
                                   oracles=oracles)
            dealt.append((position, case, schedule, future))
        settle(every_case=False)

    def settle(*, every_case: bool) -> None:
        """--jobs: counts the dealt cases judged so far, in stream order, so that the count, the log and
        the first detection are those of a campaign judging one case at a time. Waits while `jobs`
        cases are being judged, or with `every_case` until every dealt case is counted. A failure
        (without --keep-going) ends the pass: `FailureDealt`."""
        while dealt:
            position, case, schedule, future = dealt[0]
            if not future.done():
                running = [entry[3] for entry in dealt if not entry[3].done()]
                if not every_case and len(running) < jobs:
                    return
                began = time.perf_counter()
                futures.wait(running, return_when=futures.FIRST_COMPLETED)
                result.waited_s += time.perf_counter() - began
                continue
            dealt.popleft()
            judged = future.result()
            result.add_phases(judged)
            count(case, schedule, judged, position, partitioned=True)
            if judged.findings and keep_going == 1:
                raise FailureDealt(judged, schedule)

    def stream_phase(position: Optional[int]) -> StreamPhase:
        """The part of the stream a counted case belongs to: the seed cases, then the coverage-first phase's."""
        if position is None:
            return StreamPhase.DATABASE
        if position < len(chosen_seeds):
            return StreamPhase.SEED
        return StreamPhase.COVERAGE_FIRST if position < len(chosen_seeds) + first.cases else StreamPhase.DRAWN

    def drawing() -> bool:
        """Whether a case met now is the stream's next one: not one hypothesis tries while shrinking a failure."""
        return replaying_to is not None or result.first_detection_seconds is None or keep_going > 1

    def covering_case(case, schedule, *, partitioned: bool, handle):
        """A case of the coverage-first phase: the stream keeps it only if it reaches a value no case before it
        reached (hypothesis draws another instead). Once every reachable value is reached the phase is over: the
        draws left of its examples are neither kept nor judged (raising to stop hypothesis would store the draw in
        the example database, as it stores any example that raises). A failure replayed from the database (not
        `partitioned`) or shrunk is judged as it is."""
        if partitioned and drawing():
            if first.complete:
                return
            if not first.keeps(case, schedule):
                reject()
        handle(case, schedule, partitioned=partitioned)

    def drawn_case(case, schedule, *, handle):
        """A case drawn after the coverage-first phase; one the phase judged already is drawn again: hypothesis
        draws each test's simplest case first, and the simplest drawn case is also the simplest one aimed at the
        table's first value (an EXTEND batch)."""
        if drawing() and (case.to_json(), schedule) in first.kept:
            reject()
        handle(case, schedule, partitioned=True)

    cases_drawn = cases(semantics, budget=PROFILE_BUDGETS[profile], without=without, dims=dims, contracts=contracts)
    cases_covering = covering_cases(semantics, budget=PROFILE_BUDGETS[profile], reachable=reachable, dims=dims,
                                    contracts=contracts)

    def hypothesis_test(phases, strategy, body, *, examples: int, part: str = "", explicit: Sequence = (),
                        shrinks: bool = True):
        """`body(case, schedule)` on the cases of `strategy`; `part` keeps the coverage-first phase's failures
        apart from the drawn ones' in the example database (and its stream apart under a derandomized profile)."""
        hypothesis_shrinks = shrinks and shrink and keep_going == 1  # --keep-going's failures are shrunk afterwards

        @settings(deadline=None, database=db, phases=phases + ([Phase.shrink] if hypothesis_shrinks else []),
                  print_blob=False, suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                  **{**base, "max_examples": examples})
        @given(case=strategy, schedule=schedules() if device == "cpu" else _adversarial())
        def test(case, schedule):
            body(case, schedule)  # the same code in every pass: one derandomized stream

        test.hypothesis.inner_test._hypothesis_internal_add_digest = database_scope(
            target_spec=target_spec, mutant=mutant, semantics=semantics, device=device) + part.encode()
        for case in reversed(explicit):
            test = example(case=case, schedule="adversarial")(test)
        return _seeded(test, seed) if seed is not None else test

    def run_stream(phases, *, handle=campaign_case, shrinks: bool = True) -> None:
        """The case stream, from its start: the seed cases (`Phase.explicit`), the coverage-first cases, the drawn
        ones. The coverage-first phase starts from what the seeds reach, and how many cases it keeps sets how many
        are drawn after it."""
        nonlocal first
        first = CoverageFirst(frozenset(reachable))
        for case in chosen_seeds:
            first.add(case)
        drawn_phases = [phase for phase in phases if phase is not Phase.explicit]
        with pinned_stream():
            if chosen_seeds and Phase.explicit in phases:
                hypothesis_test([Phase.explicit], cases_drawn, functools.partial(handle, partitioned=True),
                                examples=1, explicit=chosen_seeds, shrinks=shrinks)()
            if not drawn_phases:
                return
            if first_cases > 0 and not first.complete:
                hypothesis_test(drawn_phases, cases_covering, functools.partial(covering_case, partitioned=True,
                                                                                handle=handle),
                                examples=first_cases, part=";coverage-first", shrinks=shrinks)()
            hypothesis_test(drawn_phases, cases_drawn, functools.partial(drawn_case, handle=handle),
                            examples=base["max_examples"] - first.cases, shrinks=shrinks)()

    def database_pass() -> None:
        """The failures stored in the example database, of the coverage-first phase and of the drawn cases; none
        is part of the stream."""
        with pinned_stream():
            for strategy, body, part in (
                    (cases_covering, functools.partial(covering_case, partitioned=False, handle=campaign_case),
                     ";coverage-first"),
                    (cases_drawn, functools.partial(campaign_case, partitioned=False), "")):
                with contextlib.suppress(SkipTest):  # nothing stored for this part
                    hypothesis_test([Phase.reuse], strategy, body, examples=base["max_examples"], part=part)()

    def dealt_pass(phases) -> None:
        """--jobs: the case stream dealt to the children, counted in stream order. At its first failure
        the stream is drawn again, one case at a time and judging none, up to that case, where the
        failure is raised inside hypothesis, which shrinks it as a campaign judging one case at a time
        would (the same seed draws the same stream)."""
        nonlocal replaying_to
        try:
            try:
                run_stream(phases, handle=deal, shrinks=False)
            except CampaignInterrupted:
                settle(every_case=True)  # the cases in flight finish and count, as the one in flight does
                raise
            settle(every_case=True)
            return
        except FailureDealt as stopped:
            failure, schedule = stopped.result, stopped.schedule
        key = (failure.case.to_json(), schedule)
        failing[key] = failure
        if not shrink or result.found_on_seed or result.interrupted:
            raise FindingRaised(failure)  # a seed's failure is shrunk below, as one judged one at a time
        replaying_to = key
        run_stream(phases)
        print(f"warning: the replay of the stream did not meet its failing case {case_digest(failure.case, schedule)}: "
              "shrunk greedily instead of by hypothesis", file=sys.stderr)
        raise FindingRaised(failure, by_hypothesis=False)

    main_phases = [Phase.explicit] if from_db else [Phase.explicit, Phase.generate, Phase.target]
    passes = ([database_pass] if db is not None else []) + [
        functools.partial(dealt_pass, main_phases) if jobs > 1 else functools.partial(run_stream, main_phases)]
    try:
        for run_pass in passes:
            run_pass()
    except FindingRaised as raised:
        result.minimal = raised.result
        if shrink and (result.found_on_seed or not raised.by_hypothesis) and not result.interrupted:
            result.minimal = shrink_failure(lambda c: judge(c, device, schedule="adversarial", target_spec=target_spec,
                                                            mutant=mutant, oracles=oracles),
                                            raised.result, budget_s=shrink_seconds)
        if shrink and not result.interrupted:
            result.shrunk = True
            result.shrink_seconds = time.perf_counter() - start - result.first_detection_seconds
    except (CampaignInterrupted, EnoughFailures):
        pass
    try:
        if collected:
            _shrink_collected(result, collected, judge, device=device, target_spec=target_spec, mutant=mutant,
                              oracles=oracles, shrink=shrink and not result.interrupted, budget_s=shrink_seconds)
    finally:
        if runner:
            runner.close()
    result.duration_s = time.perf_counter() - start
    return result


def check_jobs(jobs: int, isolate_s: Optional[float]) -> None:
    if jobs < 1:
        raise InvalidArgument(f"--jobs={jobs}: must be >= 1 (the cases judged at once)")
    if jobs > 1 and not isolate_s:
        raise InvalidArgument(f"--jobs={jobs}: cases judged at once are each judged in a child process; "
                              "--isolate off leaves none (give --isolate SECONDS or auto)")


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


def _shrink_collected(result: CampaignResult, collected: dict, judge, *, device, target_spec, mutant, oracles,
                      shrink: bool, budget_s: float) -> None:
    """Each of --keep-going's failures, shrunk under its own schedule policy, `budget_s` each."""
    began = time.perf_counter()
    for failure, schedule in collected.values():
        if shrink:
            failure = shrink_failure(lambda c, schedule=schedule: judge(c, device, schedule=schedule,
                                                                        target_spec=target_spec, mutant=mutant,
                                                                        oracles=oracles),
                                     failure, budget_s=budget_s)
        result.failures.append(failure)
    result.minimal = result.failures[0]
    result.shrunk = shrink
    result.shrink_seconds = time.perf_counter() - began if shrink else None


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


def _adversarial():
    return st.just("adversarial")


def _seeded(test, seed: int):
    """The case stream of `seed`, with the example database kept.

    Hypothesis's own `@seed(n)` sets this same attribute and also turns the database off: it is meant
    for reproducing one run. A campaign needs both: the seed fixes the stream that shards and
    workers partition, and the database keeps the failures found in it, for `--from-db` on every host.
    The tests in tests/test_sharding.py and tests/test_example_db.py fail if hypothesis changes this.
    """
    test._hypothesis_internal_use_seed = seed
    return test
