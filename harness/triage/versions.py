"""Multi-version triage: the first sglang version where a contract or a case starts failing.

Each version's wheel is fetched from PyPI without its dependencies; a version whose wheel lacks the DSV4
backend module is "not applicable" and never installed. The others are installed in turn into one
environment (the CPU requirements of the sglang target and the harness; the few pure-Python packages a
version pins differently, such as transformers, are installed over it for that version, torch stays), and
`python -m harness triage --target sglang` runs inside it. Its triage.json and exit code give the
version's verdict; a version the target cannot drive gets `triage --static-only`, the source check alone.

Verdicts, in version order (packaging.version): pass; fail (a contract or static break, or a finding,
also a static break of a version the target cannot drive); crash (the inner triage died without a report);
unsupported (the target cannot drive this version, exit 3 with the reason, and the static check alone finds
nothing or cannot run) which counts as failing only after a version passed (the interface went away);
not applicable (no DSV4 backend module), failing only when asked.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from harness.errors import EnvironmentBroken, ExitCode, InvalidArgument
from harness.sglang_target.api import BACKEND
from reports.schema import VERSIONS
from reports.writers import write_report

BACKEND_FILE = BACKEND.replace(".", "/") + ".py"
MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
PASS, FAIL, CRASH, UNSUPPORTED, NOT_APPLICABLE, NOT_RUN = (
    "pass", "fail", "crash", "unsupported", "not applicable", "not run")


@dataclass
class VersionResult:
    version: str
    status: str
    detail: str
    report: dict | None = None


@dataclass
class VersionsOutcome:
    results: list[VersionResult]
    first_failing: str | None
    last_passing: str | None

    def matrix(self) -> list[dict]:
        """Version by check: each version's verdict and the count of each check's breaks or findings (None
        where the check did not run), and the attributes each entry point reads on every call."""
        rows = []
        for r in self.results:
            report = r.report or {}
            campaign = report.get("campaign")
            rows.append({"version": r.version, "status": r.status,
                         "contract": len(report["contract_breaks"]) if "contract_breaks" in report else None,
                         "static": len(report["static_breaks"]) if "static_breaks" in report else None,
                         "findings": len(campaign["findings"]) if campaign else None,
                         "cases": campaign.get("cases") if campaign else None,
                         "every_call_reads": {entry: [read["attribute"] for read in reads] for entry, reads
                                              in (report.get("every_call_reads") or {}).items()}})
        return rows

    def first_every_call_reads(self) -> list[dict]:
        """Each attribute an entry point reads on every call that an earlier version's did not: the first
        version that reads it, with the call path and line. An object built without `__init__` (SGLang's own
        unit tests build a backend so) breaks there: 'object has no attribute ...'."""
        firsts, before = [], None
        for r in self.results:
            reads = (r.report or {}).get("every_call_reads")
            if reads is None:
                continue
            for entry, entry_reads in reads.items():
                for read in entry_reads:
                    if before is not None and read["attribute"] not in before.get(entry, set()):
                        firsts.append({"version": r.version, "entry": entry, **read})
            before = {entry: {read["attribute"] for read in entry_reads} for entry, entry_reads in reads.items()}
        return firsts

    def to_json(self) -> dict:
        return {"first_failing": self.first_failing, "last_passing": self.last_passing,
                "versions": [asdict(r) for r in self.results], "matrix": self.matrix(),
                "first_every_call_reads": self.first_every_call_reads()}


class Installer(Protocol):
    def wheel(self, version: str) -> Path: ...

    def python_for(self, version: str, wheel: Path) -> Path: ...

    def install_missing(self, version: str, wheel: Path, module: str) -> bool:
        """Install the version's own requirement that provides `module`; False if it has none."""


# (python, version, report dir, static_only=...) -> (exit code, output) of `python -m harness triage`
Triage = Callable[..., tuple[int, str]]


def parse_versions(text: str, name: str = "versions") -> list[str]:
    """`0.5.23,0.5.21` -> versions in packaging order; a bad entry is refused naming the text `name`, the
    caller's name for it (the command line's flag)."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise InvalidArgument(f"{name}: give comma-separated sglang versions, e.g. 0.5.21,0.5.22,0.5.23")
    try:
        parsed = sorted({Version(v): v for v in items}.items())
    except InvalidVersion as exc:
        raise InvalidArgument(f"{name}: {exc} (expected versions such as 0.5.22 or 0.5.15.post1)") from None
    return [v for _, v in parsed]


def ships_backend(wheel: Path) -> bool:
    try:
        with zipfile.ZipFile(wheel) as z:
            return BACKEND_FILE in z.namelist()
    except zipfile.BadZipFile:
        raise EnvironmentBroken(f"{wheel} is not a wheel (a partial download?): delete it and run again") from None


def _error_line(output: str) -> str:
    """The CLI's `error: ...` line (what exit 3 says is missing), else the output's last lines."""
    lines = output.strip().splitlines()
    return next((line[len("error: "):] for line in lines[::-1] if line.startswith("error: ")),
                "\n".join(lines[-3:]))


def _verdict(version: str, code: int, output: str, report_dir: Path) -> VersionResult:
    path = report_dir / "triage.json"
    report = json.loads(path.read_text()) if path.is_file() else None
    tail = "\n".join(output.strip().splitlines()[-5:])
    if code == 3:
        return VersionResult(version, UNSUPPORTED, _error_line(output))
    if code == 2:
        raise EnvironmentBroken(f"sglang {version}: the inner `python -m harness triage` rejected its arguments "
                                f"(the harness installed there is not this one?):\n{tail}")
    if report is None:
        if code == 0:
            raise EnvironmentBroken(f"sglang {version}: the inner triage exited 0 but wrote no {path}")
        return VersionResult(version, CRASH, f"triage exited {code} without a report:\n{tail}")
    campaign = report.get("campaign", {})
    breaks = report.get("contract_breaks", []) + report.get("static_breaks", [])
    findings = campaign.get("findings", [])
    summary = (f"{report.get('semantics')} semantics: {len(report.get('contract_breaks', []))} contract break(s), "
               f"{len(report.get('static_breaks', []))} static break(s), {len(findings)} finding(s) "
               f"in {campaign.get('cases', 0)} cases")
    if code == 0:
        return VersionResult(version, PASS, summary, report)
    if breaks:
        b = breaks[0]
        summary += f"; first: {b['cls']}.{b['attribute']} read at {b['file']}:{b['line']}"
    elif findings:
        summary += f"; first: [{findings[0].get('oracle')}/{findings[0].get('kind')}] {findings[0].get('message')}"
    return VersionResult(version, FAIL, summary, report)


def _static_verdict(unsupported: VersionResult, code: int, output: str, report_dir: Path) -> VersionResult:
    """A version the target cannot drive, judged by `triage --static-only`: its static breaks fail it."""
    version, why = unsupported.version, unsupported.detail
    path = report_dir / "triage.json"
    report = json.loads(path.read_text()) if path.is_file() and code in (0, 1) else None
    if report is None:
        return VersionResult(version, UNSUPPORTED,
                             f"{why}; the static check did not run either (exit {code}): {_error_line(output)}")
    breaks = report.get("static_breaks", [])
    summary = f"the static check alone: {len(breaks)} static break(s) in {len(report.get('static_classes', []))} classes"
    if not breaks:
        return VersionResult(version, UNSUPPORTED, f"{why}; {summary}", report)
    b = breaks[0]
    return VersionResult(version, FAIL, f"{summary}; first: {b['cls']}.{b['attribute']} read at {b['file']}:{b['line']} "
                                        f"(the target cannot drive this version: {why})", report)


class VersionTriage:
    """Runs the inner triage for each version, through an installer (PyPI, or a fake in tests)."""

    def __init__(self, installer: Installer, triage: Triage, report_dir: Path, *, missing_fails: bool = False):
        self.installer, self.triage, self.report_dir = installer, triage, report_dir
        self.missing_fails = missing_fails

    def evaluate(self, version: str) -> VersionResult:
        wheel = self.installer.wheel(version)
        if not ships_backend(wheel):
            return VersionResult(version, NOT_APPLICABLE, f"{BACKEND} missing")
        python = self.installer.python_for(version, wheel)
        out = self.report_dir / version
        out.mkdir(parents=True, exist_ok=True)
        result = _verdict(version, *self._triage(python, version, wheel, out, static_only=False), out)
        if result.status != UNSUPPORTED:
            return result
        # The target cannot drive it: the source check alone.
        return _static_verdict(result, *self._triage(python, version, wheel, out, static_only=True), out)

    def _triage(self, python: Path, version: str, wheel: Path, out: Path, *, static_only: bool) -> tuple[int, str]:
        """The inner triage; where it cannot import a module the version itself requires (older versions
        import xgrammar, say), that requirement is installed and the triage run again."""
        tried: set[str] = set()
        while True:
            (out / "triage.json").unlink(missing_ok=True)
            code, output = self.triage(python, version, out, static_only=static_only)
            missing = MISSING_MODULE.search(output) if code == 3 else None
            module = missing.group(1).split(".")[0] if missing else None
            if module is None or module in tried or not self.installer.install_missing(version, wheel, module):
                return code, output
            tried.add(module)

    def failing(self, result: VersionResult, passed_before: bool) -> bool:
        return (result.status in (FAIL, CRASH) or (result.status == UNSUPPORTED and passed_before)
                or (result.status == NOT_APPLICABLE and self.missing_fails))

    def run(self, versions: list[str], *, bisect: bool = False, on_result=lambda r: None) -> VersionsOutcome:
        """Every version in order, or (bisect) as few as a binary search needs, assuming that once a version
        fails every later one does."""
        results = {v: VersionResult(v, NOT_RUN, "not run (bisection)") for v in versions}

        def evaluate(v: str, passed_before: bool) -> bool:
            results[v] = r = self.evaluate(v)
            on_result(r)
            return self.failing(r, passed_before)

        first = None
        if not bisect:
            passed = False
            for v in versions:
                if evaluate(v, passed) and first is None:
                    first = v
                passed = passed or results[v].status == PASS
        else:
            first = self._bisect(versions, evaluate, results)
        order = versions.index(first) if first else len(versions)
        last = next((v for v in versions[:order][::-1] if results[v].status == PASS), None)
        return VersionsOutcome([results[v] for v in versions], first, last)

    def _bisect(self, versions, evaluate, results) -> str | None:
        lo = 0  # the oldest version that can run: the bisection's good end
        while lo < len(versions):
            if evaluate(versions[lo], False):
                return versions[lo]
            if results[versions[lo]].status == PASS:
                break
            lo += 1
        hi = len(versions) - 1
        if lo >= hi or not evaluate(versions[hi], True):
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if evaluate(versions[mid], True):
                hi = mid
            else:
                lo = mid
        return versions[hi]


# -- the real installer: pip into cached environments --------------------------------------------------------

Command = Callable[[list[str]], tuple[int, str]]


def _run(cmd: list[str]) -> tuple[int, str]:
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def project_root() -> Path:
    """The harness's source tree, installed (editable) into each environment."""
    root = Path(__file__).resolve().parents[2]  # harness/triage/versions.py -> the checkout
    if not (root / "pyproject.toml").is_file():
        raise EnvironmentBroken(f"multi-version triage installs the harness from its source tree, but {root} has "
                                "no pyproject.toml: run it from a checkout of the harness")
    return root


# The torch build the machine provides (requirements-cpu.txt says why it must be the CUDA 2.14.1 one): kept
# for every version, whatever the version pins.
KEEP = frozenset({"torch", "torchvision", "triton"})


def wheel_requirements(wheel: Path) -> dict[str, Requirement]:
    """The requirements the wheel's METADATA states unconditionally (no marker, no extra), by canonical name."""
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = z.read(meta).decode() if meta else ""
    reqs = (Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
            if line.startswith("Requires-Dist:"))
    return {canonicalize_name(r.name): r for r in reqs if r.marker is None}


def exact_pins(wheel: Path) -> dict[str, str]:
    """`name==version` requirements the wheel pins, by canonical name."""
    pins = {}
    for name, req in wheel_requirements(wheel).items():
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==":
            pins[name] = f"{req.name}=={specs[0].version}"
    return pins


def requirements_for(base: str, wheel: Path) -> str:
    """The CPU requirements (pinned as the newest version pins them) with the version's own exact pins; a
    package the version does not pin is left to pip's resolver (tokenizers follows transformers), and the
    machine's torch is kept."""
    pins, lines = exact_pins(wheel), []
    for line in base.splitlines():
        text = line.split("#", 1)[0].strip()
        req = Requirement(text) if text else None
        name = canonicalize_name(req.name) if req else None
        if req is None or name in KEEP:
            lines.append(line)
        elif name in pins:
            lines.append(pins[name])
        else:
            lines.append(req.name if any(s.operator == "==" for s in req.specifier) else line)
    return "\n".join(lines) + "\n"


class PipInstaller:
    """Wheels in `cache/wheels`; one venv per CPU requirement set in `cache/env-<hash>`, made once and kept
    (a marker records a complete install). For each version, the packages it pins differently are installed
    over the environment's current set (`pinned.txt` records it), then its sglang wheel over the last one; a
    module the version imports but the CPU set lacks is installed, as the version requires it, on demand."""

    def __init__(self, cache_dir: Path, requirements: Path, root: Path, *, run: Command = _run,
                 python: str = sys.executable):
        self.cache, self.requirements, self.root, self.run_cmd, self.python = cache_dir, requirements, root, run, python
        if not requirements.is_file():
            raise EnvironmentBroken(f"requirements file {requirements} is missing")

    def _run(self, what: str, cmd: list) -> str:
        code, output = self.run_cmd([str(c) for c in cmd])
        if code != 0:
            tail = "\n".join(line[:300] for line in output.strip().splitlines()[-8:])
            raise EnvironmentBroken(f"{what} failed (exit {code}): {' '.join(map(str, cmd))}\n{tail}")
        return output

    def wheel(self, version: str) -> Path:
        folder = self.cache / "wheels"
        found = sorted(folder.glob(f"sglang-{version}-*.whl"))
        if not found:
            folder.mkdir(parents=True, exist_ok=True)
            self._run(f"downloading sglang {version} from PyPI",
                      [self.python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                       f"sglang=={version}", "-d", folder])
            found = sorted(folder.glob(f"sglang-{version}-*.whl"))
        if not found:
            raise EnvironmentBroken(f"pip downloaded no wheel for sglang=={version} into {folder}")
        return found[0]

    def environment(self) -> Path:
        base = self.requirements.read_text()
        env = self.cache / f"env-{hashlib.sha256((base + sys.version).encode()).hexdigest()[:12]}"
        if not (env / ".complete").is_file():
            self._run("creating the environment", [self.python, "-m", "venv", "--clear", env])
            self._run("installing the CPU requirements",
                      [env / "bin" / "python", "-m", "pip", "install", "-q", "-r", self.requirements])
            self._run("installing the harness",
                      [env / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "-e", self.root])
            (env / "pinned.txt").write_text(base)
            (env / ".complete").write_text("")
        return env

    def install_missing(self, version: str, wheel: Path, module: str) -> bool:
        req = wheel_requirements(wheel).get(canonicalize_name(module))
        if req is None or canonicalize_name(req.name) in KEEP:
            return False
        python = self.environment() / "bin" / "python"
        self._run(f"installing {req} (sglang {version} imports {module})", [python, "-m", "pip", "install", "-q", str(req)])
        return True

    def python_for(self, version: str, wheel: Path) -> Path:
        env = self.environment()
        python = env / "bin" / "python"
        wanted = requirements_for(self.requirements.read_text(), wheel)
        current = set((env / "pinned.txt").read_text().splitlines())
        changed = [line for line in wanted.splitlines() if line.split("#", 1)[0].strip() and line not in current]
        if changed:  # in one command, so that pip resolves them together
            self._run(f"installing sglang {version}'s own pins", [python, "-m", "pip", "install", "-q", *changed])
            (env / "pinned.txt").write_text(wanted)
        probe = [python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"]
        code, installed = self.run_cmd([str(c) for c in probe])
        if code != 0 or installed.strip() != version:
            self._run(f"installing sglang {version}",
                      [python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel])
            installed = self._run(f"checking sglang {version}", probe)
        if installed.strip() != version:
            raise EnvironmentBroken(f"sglang {version} was installed but the environment reports {installed.strip()!r}")
        return python


def inner_triage(*, examples: int, device: str, root: Path) -> Triage:
    """`python -m harness triage --target sglang` in the version's environment, from the source tree."""

    def run(python: Path, version: str, out: Path, *, static_only: bool) -> tuple[int, str]:
        cmd = [str(python), "-m", "harness", "triage", "--target", "sglang", "--semantics", "auto",
               "--device", device, "--examples", str(examples), "--report-dir", str(out)]
        cmd += ["--static-only"] if static_only else []
        proc = subprocess.run(cmd, check=False, cwd=root, capture_output=True, text=True)  # Triton's mode: as the target chooses
        (out / ("static.log" if static_only else "triage.log")).write_text(proc.stdout + proc.stderr)
        return proc.returncode, proc.stdout + proc.stderr

    return run


def render_matrix(outcome: VersionsOutcome) -> str:
    """The version by check matrix as text: one row a version."""
    def cell(value) -> str:
        return "-" if value is None else str(value)

    lines = ["version   status          contract static findings/cases  entry points' every-call reads"]
    for row in outcome.matrix():
        reads = "; ".join(f"{entry}: {', '.join(attrs) or 'none'}" for entry, attrs in row["every_call_reads"].items())
        lines.append(f"{row['version']:9} {row['status']:15} {cell(row['contract']):8} {cell(row['static']):6} "
                     f"{cell(row['findings']) + '/' + cell(row['cases']):15} {reads or '-'}")
    return "\n".join(lines)


def triage_versions(args, versions: list[str]) -> int:
    """`python -m harness triage --versions ...`: print each version's verdict and the first failing one.
    `versions`: `parse_versions`'s, which the command calls naming its flag."""
    report_dir = Path(args.report_dir)
    root = project_root()
    cache = Path(args.cache_dir) if args.cache_dir else report_dir / "envs"
    installer = PipInstaller(cache, root / "harness" / "sglang_target" / "requirements-cpu.txt", root)
    runner = VersionTriage(installer, inner_triage(examples=args.examples, device=args.device, root=root),
                           report_dir / "versions", missing_fails=args.missing_backend_fails)
    outcome = runner.run(versions, bisect=args.bisect,
                         on_result=lambda r: print(f"sglang {r.version}: {r.status}: {r.detail}", flush=True))
    write_report(report_dir / VERSIONS, outcome.to_json())
    print(render_matrix(outcome))
    for first in outcome.first_every_call_reads():
        print(f"sglang {first['version']}: {first['entry']} now reads self.{first['attribute']} on every call, by "
              f"{' -> '.join(first['call_path'])} at {first['file']}:{first['line']}: a backend built without "
              "__init__ (as SGLang's unit tests build one) breaks there")
    if outcome.first_failing:
        first = next(r for r in outcome.results if r.version == outcome.first_failing)
        since = f" (last passing: {outcome.last_passing})" if outcome.last_passing else ""
        print(f"first failing version: {first.version}{since}: {first.status}: {first.detail}")
    else:
        print(f"no failing version among {', '.join(versions)}")
    print(f"report: {report_dir / VERSIONS}")
    return ExitCode.FOUND if outcome.first_failing else ExitCode.OK
