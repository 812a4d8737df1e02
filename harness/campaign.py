"""The fuzz campaign: hypothesis draws cases, every case is judged, a failure shrinks and replays.

Profiles (`settings.register_profile`): ``dev`` (small, local database), ``ci`` (derandomized, no
deadline, 200 examples), ``nightly`` (large and random). The example database lives in the report
folder, so a nightly failure replays from it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from harness.engine import CaseResult, Finding, run_case
from harness.errors import InvalidArgument
from harness.isolation import IsolatedRunner
from harness.strategies import cases, schedules, seed_cases

PROFILES = {
    "dev": dict(max_examples=50, derandomize=False),
    "ci": dict(max_examples=200, derandomize=True),
    "nightly": dict(max_examples=5000, derandomize=False),
}


class FindingRaised(AssertionError):
    """Raised inside the hypothesis test so that it shrinks the case; carries the judged result."""

    def __init__(self, result: CaseResult):
        first = result.findings[0]
        super().__init__(f"{first.oracle}/{first.kind}: {first.message}\nreplay: {result.replay}")
        self.result = result


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
    stand_ins: list[dict] = dataclasses.field(default_factory=list)  # the target's stood-in modules, if any

    @property
    def findings(self) -> list[Finding]:
        return self.minimal.findings if self.minimal else []

    def summary(self) -> dict:
        case = self.minimal.case if self.minimal else None
        return {
            "target": self.target, "device": self.device, "semantics": self.semantics, "seed": self.seed,
            "profile": self.profile, "cases": self.cases, "duration_s": round(self.duration_s, 3),
            "cases_per_second": round(self.cases / self.duration_s, 2) if self.duration_s else None,
            "first_detection": None if self.first_detection_examples is None else {
                "examples": self.first_detection_examples, "seconds": round(self.first_detection_seconds, 3)},
            "findings": [
                {**dataclasses.asdict(f), "case": json.loads(case.to_json()), "case_summary": case.summary(),
                 "replay": self.minimal.replay}
                for f in self.findings
            ],
            "cases_log": self.cases_log,
            "stand_ins": self.stand_ins,
        }


def run_campaign(target, *, target_spec: str = "reference", device: str = "cpu", semantics: str = "0.5.23",
                 examples: Optional[int] = None, seed: Optional[int] = None, profile: str = "ci",
                 database_dir: Optional[Path] = None, mutant: Optional[str] = None,
                 on_case: Callable[[CampaignResult], None] = lambda r: None, shrink: bool = True,
                 oracles: Optional[frozenset] = None, shrink_seconds: float = 30.0,
                 seeds: bool = True, from_db: bool = False, isolate_s: Optional[float] = None) -> CampaignResult:
    """`seeds`: start from one case of each protocol shape (`strategies.seed_cases`), then draw.
    `from_db`: replay only the failures stored in the example database (a nightly's, kept in its folder).
    `isolate_s`: judge each case in a child process with this timeout, so a case that kills the CUDA
    context or hangs is a finding with its replay command, not the end of the run."""
    if profile not in PROFILES:
        raise InvalidArgument(f"--profile={profile!r} is not one of: {', '.join(PROFILES)}")
    if examples is not None and examples < 1:
        raise InvalidArgument(f"--examples={examples}: must be >= 1")
    base = dict(PROFILES[profile])
    if examples is not None:
        base["max_examples"] = examples
    if seed is not None:
        base["derandomize"] = False  # an explicit seed replaces the profile's fixed one
    # The seeds count as examples: --examples N runs N cases in all.
    chosen_seeds = seed_cases(semantics)[: max(0, base["max_examples"] - 1)] if seeds else []
    base["max_examples"] -= len(chosen_seeds)
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target] + ([Phase.shrink] if shrink else [])
    db = DirectoryBasedExampleDatabase(str(database_dir)) if database_dir and not base["derandomize"] else None
    if from_db:  # the seeds are deterministic, so replaying them with the database replays every failure
        if db is None:
            raise InvalidArgument(f"--from-db: the {profile!r} profile keeps no example database (dev and nightly "
                                  "do); replay with the profile that wrote it")
        phases = [Phase.explicit, Phase.reuse] + ([Phase.shrink] if shrink else [])
    result = CampaignResult(target=target_spec, device=device, semantics=semantics, seed=seed, profile=profile,
                            stand_ins=list(getattr(target, "stand_ins", [])))
    start = time.perf_counter()

    failing: dict[tuple[str, str], CaseResult] = {}
    runner = IsolatedRunner(timeout_s=isolate_s) if isolate_s else None
    judge = runner.run_case if runner else functools.partial(run_case, target)

    @settings(deadline=None, database=db, phases=phases, print_blob=False,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False, **base)
    @given(case=cases(semantics), schedule=schedules() if device == "cpu" else _adversarial())
    def campaign_case(case, schedule):
        key = (case.to_json(), schedule)
        judged = failing.get(key)  # hypothesis replays its minimal example at the end
        if judged is None:
            if result.first_detection_seconds is not None and (
                    time.perf_counter() - start - result.first_detection_seconds > shrink_seconds):
                return  # the shrink budget is spent: keep the smallest failure found so far
            judged = judge(case, device, schedule=schedule, target_spec=target_spec, mutant=mutant, oracles=oracles)
            if result.first_detection_examples is None:
                result.cases += 1
                result.cases_log.append(_case_record(result.cases, time.perf_counter() - start, case, judged))
                on_case(result)
                if judged.findings:
                    result.first_detection_examples = result.cases
                    result.first_detection_seconds = time.perf_counter() - start
        if judged.findings:
            failing[key] = judged
            raise FindingRaised(judged)

    for case in reversed(chosen_seeds):
        campaign_case = example(case=case, schedule="adversarial")(campaign_case)
    if seed is not None:
        campaign_case = _seeded(campaign_case, seed)
    try:
        campaign_case()
    except FindingRaised as raised:
        result.minimal = raised.result
    finally:
        if runner:
            runner.close()
    result.duration_s = time.perf_counter() - start
    return result


def _case_record(i: int, seconds: float, case, judged: CaseResult) -> dict:
    return {"i": i, "t": round(seconds, 4), "outcome": "found" if judged.findings else "clean",
            "tokens": sum(b.num_tokens for b in case.batches),
            "requests": sum(len(b.requests) for b in case.batches),
            "graph": any(b.graph for b in case.batches), "spec": case.spec.name}


def _adversarial():
    from hypothesis import strategies as st

    return st.just("adversarial")


def _seeded(test, seed: int):
    from hypothesis import seed as hypothesis_seed

    return hypothesis_seed(seed)(test)
