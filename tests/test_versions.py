"""Multi-version triage without the network: a fake installer and a fake inner triage decide each
version's verdict; the orchestration sorts versions, finds the first failing one, bisects, keeps versions
without the DSV4 backend out unless asked, and turns a broken install into EnvironmentBroken."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import EnvironmentBroken, InvalidArgument
from harness.triage.versions import (
    BACKEND,
    BACKEND_FILE,
    CRASH,
    FAIL,
    NOT_APPLICABLE,
    NOT_RUN,
    PASS,
    UNSUPPORTED,
    PipInstaller,
    VersionTriage,
    parse_versions,
    project_root,
    requirements_for,
)

CLEAN = {"semantics": "0.5.23", "contract_breaks": [], "static_breaks": [], "campaign": {"cases": 5, "findings": []}}
BROKEN = {**CLEAN, "static_breaks": [{"cls": "DeepseekV4AttnBackend", "attribute": "token_to_kv_pool",
                                      "method": "DeepseekV4AttnBackend.prepare_prefill_shared_read_snapshot",
                                      "file": "sglang/srt/layers/attention/deepseek_v4_backend.py", "line": 1394}]}


class FakeInstaller:
    """Wheels made on the spot (with or without the backend module); installs recorded."""

    def __init__(self, folder: Path, without_backend=()):
        self.folder, self.without_backend, self.installed = folder, set(without_backend), []

    def wheel(self, version: str) -> Path:
        path = self.folder / f"sglang-{version}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("sglang/__init__.py", "")
            if version not in self.without_backend:
                z.writestr(BACKEND_FILE, "class DeepseekV4AttnBackend: ...\n")
        return path

    def python_for(self, version: str, wheel: Path) -> Path:
        self.installed.append(version)
        return Path("/env/bin/python")

    def install_missing(self, version: str, wheel: Path, module: str) -> bool:
        self.installed.append(f"{version}:{module}")
        return module == "xgrammar"


def fake_triage(verdicts: dict[str, tuple[int, dict | None, str]], static: dict | None = None):
    """The inner triage: exit code, the triage.json it writes (or none), its output; `static` for --static-only."""
    ran = []

    def run(python, version, out, *, static_only):
        ran.append(version)
        verdict = (static or {})[version] if static_only else verdicts[version]
        code, report, output = verdict.pop(0) if isinstance(verdict, list) else verdict
        if report is not None:
            (out / "triage.json").write_text(json.dumps(report))
        return code, output

    run.ran = ran
    return run


def triage(tmp_path, verdicts, *, static=None, without_backend=(), missing_fails=False):
    installer = FakeInstaller(tmp_path, without_backend)
    inner = fake_triage(verdicts, static)
    return VersionTriage(installer, inner, tmp_path / "report", missing_fails=missing_fails), installer, inner


def test_versions_sort_by_packaging_not_as_text():
    assert parse_versions("0.5.23, 0.5.9,0.5.15.post1,0.5.15") == ["0.5.9", "0.5.15", "0.5.15.post1", "0.5.23"]


@pytest.mark.parametrize("text", ["", "0.5.x,0.5.23"])
def test_bad_versions_exit_2_naming_the_option(text, tmp_path, capsys):
    assert main(["triage", "--versions", text, "--report-dir", str(tmp_path / "r")]) == 2
    assert "error: --versions: " in capsys.readouterr().err and not (tmp_path / "r").exists()
    with pytest.raises(InvalidArgument, match="^versions: "):  # the library names its parameter
        parse_versions(text)


def test_the_first_failing_version_and_the_last_passing_one(tmp_path):
    runner, installer, inner = triage(tmp_path, {"0.5.21": (0, CLEAN, ""), "0.5.22": (0, CLEAN, ""),
                                                 "0.5.23": (1, BROKEN, "")})
    outcome = runner.run(["0.5.21", "0.5.22", "0.5.23"])
    assert (outcome.first_failing, outcome.last_passing) == ("0.5.23", "0.5.22")
    assert [r.status for r in outcome.results] == [PASS, PASS, FAIL]
    assert "DeepseekV4AttnBackend.token_to_kv_pool read at sglang/srt/layers/attention/deepseek_v4_backend.py:1394" \
        in outcome.results[2].detail
    assert installer.installed == inner.ran == ["0.5.21", "0.5.22", "0.5.23"]


def test_no_failing_version(tmp_path):
    runner, _, _ = triage(tmp_path, {"0.5.22": (0, CLEAN, ""), "0.5.23": (0, CLEAN, "")})
    outcome = runner.run(["0.5.22", "0.5.23"])
    assert (outcome.first_failing, outcome.last_passing) == (None, "0.5.23")


def test_a_version_without_the_backend_is_not_applicable_unless_asked(tmp_path):
    verdicts = {"0.5.17": None, "0.5.23": (0, CLEAN, "")}
    runner, installer, _ = triage(tmp_path, verdicts, without_backend={"0.5.17"})
    outcome = runner.run(["0.5.17", "0.5.23"])
    assert outcome.first_failing is None
    assert (outcome.results[0].status, outcome.results[0].detail) == (NOT_APPLICABLE, f"{BACKEND} missing")
    assert installer.installed == ["0.5.23"]  # never installed
    asked, _, _ = triage(tmp_path, verdicts, without_backend={"0.5.17"}, missing_fails=True)
    assert asked.run(["0.5.17", "0.5.23"]).first_failing == "0.5.17"


STATIC_CLEAN = {"static_only": True, "static_breaks": [], "static_classes": ["DeepseekV4AttnBackend"]}
STATIC_BROKEN = {**STATIC_CLEAN, "static_breaks": BROKEN["static_breaks"]}
LACKS = (3, None, "...\nerror: --target sglang: the installed sglang 0.5.18 lacks AttentionBackend.resolve\n")


def test_a_version_the_target_cannot_drive_gets_the_static_check_and_fails_only_after_one_passed(tmp_path):
    runner, _, inner = triage(tmp_path, {"0.5.18": LACKS, "0.5.19": (0, CLEAN, ""), "0.5.20": LACKS},
                              static={"0.5.18": (0, STATIC_CLEAN, ""), "0.5.20": (0, STATIC_CLEAN, "")})
    outcome = runner.run(["0.5.18", "0.5.19", "0.5.20"])
    assert inner.ran == ["0.5.18", "0.5.18", "0.5.19", "0.5.20", "0.5.20"]
    assert [r.status for r in outcome.results] == [UNSUPPORTED, PASS, UNSUPPORTED]
    assert outcome.results[0].detail == ("--target sglang: the installed sglang 0.5.18 lacks AttentionBackend.resolve; "
                                         "the static check alone: 0 static break(s) in 1 classes")
    assert (outcome.first_failing, outcome.last_passing) == ("0.5.20", "0.5.19")


def test_a_static_break_fails_a_version_the_target_cannot_drive(tmp_path):
    runner, _, _ = triage(tmp_path, {"0.5.18": LACKS, "0.5.19": LACKS},
                          static={"0.5.18": (0, STATIC_CLEAN, ""), "0.5.19": (1, STATIC_BROKEN, "")})
    outcome = runner.run(["0.5.18", "0.5.19"])
    assert [r.status for r in outcome.results] == [UNSUPPORTED, FAIL] and outcome.first_failing == "0.5.19"
    assert "first: DeepseekV4AttnBackend.token_to_kv_pool read at" in outcome.results[1].detail
    assert "the target cannot drive this version" in outcome.results[1].detail


def test_a_crash_without_a_report_fails_and_a_silent_pass_is_refused(tmp_path):
    runner, _, _ = triage(tmp_path, {"0.5.23": (1, None, "Traceback ...\nAttributeError: token_to_kv_pool")})
    outcome = runner.run(["0.5.23"])
    assert outcome.first_failing == "0.5.23" and outcome.results[0].status == CRASH
    assert "AttributeError: token_to_kv_pool" in outcome.results[0].detail
    silent, _, _ = triage(tmp_path, {"0.5.23": (0, None, "")})
    with pytest.raises(EnvironmentBroken, match="exited 0 but wrote no"):
        silent.run(["0.5.23"])


def test_bisection_runs_few_versions_and_finds_the_same_first_failure(tmp_path):
    versions = [f"0.5.{n}" for n in range(10, 26)]
    verdicts = {v: (0, CLEAN, "") if i < 11 else (1, BROKEN, "") for i, v in enumerate(versions)}
    linear, _, _ = triage(tmp_path, verdicts)
    bisected, _, inner = triage(tmp_path, verdicts)
    outcome = bisected.run(versions, bisect=True)
    assert outcome.first_failing == linear.run(versions).first_failing == "0.5.21"
    assert outcome.last_passing == "0.5.20"
    assert len(inner.ran) <= 6 and sum(r.status == NOT_RUN for r in outcome.results) == len(versions) - len(inner.ran)


def test_bisection_when_the_oldest_fails_or_the_newest_passes(tmp_path):
    versions = ["0.5.21", "0.5.22", "0.5.23"]
    all_bad, _, inner = triage(tmp_path, dict.fromkeys(versions, (1, BROKEN, "")))
    assert all_bad.run(versions, bisect=True).first_failing == "0.5.21" and inner.ran == ["0.5.21"]
    all_good, _, inner = triage(tmp_path, dict.fromkeys(versions, (0, CLEAN, "")))
    assert all_good.run(versions, bisect=True).first_failing is None and inner.ran == ["0.5.21", "0.5.23"]


# -- the pip installer's failures, with a fake command runner -------------------------------------------------

def test_a_broken_install_is_environment_broken_with_pip_s_reason(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("torch\n")

    def no_such_version(cmd):
        return 1, "ERROR: Could not find a version that satisfies the requirement sglang==9.9.9\n"

    installer = PipInstaller(tmp_path / "cache", requirements, tmp_path, run=no_such_version)
    with pytest.raises(EnvironmentBroken, match=r"downloading sglang 9\.9\.9 from PyPI failed .*sglang==9\.9\.9"):
        installer.wheel("9.9.9")

    def requirements_fail(cmd):
        return (1, "ERROR: No matching distribution found for torch\n") if "-r" in cmd else (0, "")

    installer = PipInstaller(tmp_path / "cache", requirements, tmp_path, run=requirements_fail)
    with pytest.raises(EnvironmentBroken, match="(?s)installing the CPU requirements failed.*No matching distribution"):
        installer.python_for("0.5.23", wheel_with_pins(tmp_path, "0.5.23"))


def wheel_with_pins(folder: Path, version: str, *pins: str) -> Path:
    path = folder / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"sglang-{version}.dist-info/METADATA", "Name: sglang\n" + "".join(
            f"Requires-Dist: {p}\n" for p in pins) + "Requires-Dist: flashinfer; extra == 'cuda'\n")
    return path


def test_requirements_take_the_version_s_pins_leave_the_rest_to_pip_and_keep_torch(tmp_path):
    wheel = wheel_with_pins(tmp_path, "0.5.17", "torch==2.13.0", "Transformers==5.12.1", "numpy>=1")
    base = "# comment\ntorch==2.14.1\ntransformers==5.19.0\ntokenizers==0.23.2\nnumpy\n"
    assert requirements_for(base, wheel) == "# comment\ntorch==2.14.1\nTransformers==5.12.1\ntokenizers\nnumpy\n"
    newest = wheel_with_pins(tmp_path, "0.5.23", "transformers==5.19.0", "tokenizers==0.23.2")
    assert requirements_for(base, newest) == base


def test_one_environment_the_version_s_pins_over_it_and_the_wheel_swapped(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("torch==2.14.1\ntransformers==5.19.0\n")
    commands, installed = [], {"version": "0.5.22"}

    def pip(cmd):
        commands.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            Path(cmd[-1]).mkdir(parents=True, exist_ok=True)
        if "--force-reinstall" in cmd:
            installed["version"] = Path(cmd[-1]).name.split("-")[1]
        return 0, installed["version"] + "\n" if cmd[1] == "-c" else ""

    installer = PipInstaller(tmp_path / "cache", requirements, tmp_path, run=pip)
    for version, pins in (("0.5.23", ["transformers==5.19.0"]), ("0.5.21", ["transformers==5.12.1"]),
                          ("0.5.20", ["transformers==5.12.1"])):
        installer.python_for(version, wheel_with_pins(tmp_path, version, *pins))
    assert sum(c[1:3] == ["-m", "venv"] for c in commands) == 1  # one environment, reused
    assert [c[5:] for c in commands if c[3:5] == ["install", "-q"] and "transformers" in " ".join(c)] == [
        ["transformers==5.12.1"]]  # 0.5.21's pin installed once; 0.5.20 pins the same
    assert [Path(c[-1]).name.split("-")[1] for c in commands if "--force-reinstall" in c] == [
        "0.5.23", "0.5.21", "0.5.20"]

    def stale(cmd):
        return 0, "0.5.22\n" if cmd[1] == "-c" else ""

    with pytest.raises(EnvironmentBroken, match="sglang 0.5.23 was installed but the environment reports '0.5.22'"):
        PipInstaller(tmp_path / "cache", requirements, tmp_path, run=stale).python_for(
            "0.5.23", wheel_with_pins(tmp_path, "0.5.23"))


def test_a_version_whose_modules_do_not_import_says_why_the_static_check_did_not_run(tmp_path):
    failed = (3, None, "UserWarning: ...\nerror: static check: importing x failed: No module named 'xgrammar'\n")
    runner, _, _ = triage(tmp_path, {"0.5.17": LACKS}, static={"0.5.17": failed})
    (result,) = runner.run(["0.5.17"]).results
    assert result.status == UNSUPPORTED and result.detail.endswith(
        "the static check did not run either (exit 3): static check: importing x failed: No module named 'xgrammar'")


def test_a_module_the_version_requires_is_installed_and_the_triage_run_again(tmp_path):
    no_xgrammar = (3, None, "error: cannot import x (ModuleNotFoundError: No module named 'xgrammar.grammar')\n")
    no_other = (3, None, "error: cannot import x (ModuleNotFoundError: No module named 'uvloop')\n")
    runner, installer, inner = triage(tmp_path, {"0.5.19": [no_xgrammar, LACKS], "0.5.20": no_other},
                                      static={"0.5.19": (0, STATIC_CLEAN, ""), "0.5.20": no_other})
    outcome = runner.run(["0.5.19", "0.5.20"])
    assert inner.ran == ["0.5.19", "0.5.19", "0.5.19", "0.5.20", "0.5.20"]
    assert installer.installed == ["0.5.19", "0.5.19:xgrammar", "0.5.20", "0.5.20:uvloop", "0.5.20:uvloop"]
    assert outcome.results[0].detail.endswith("the static check alone: 0 static break(s) in 1 classes")
    assert "No module named 'uvloop'" in outcome.results[1].detail


def test_the_installer_installs_what_the_version_requires_for_a_missing_module(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("torch==2.14.1\n")
    commands = []

    def pip(cmd):
        commands.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            Path(cmd[-1]).mkdir(parents=True, exist_ok=True)
        return 0, ""

    installer = PipInstaller(tmp_path / "cache", requirements, tmp_path, run=pip)
    wheel = wheel_with_pins(tmp_path, "0.5.19", "xgrammar==0.2.1", "torch==2.13.0")
    assert installer.install_missing("0.5.19", wheel, "xgrammar") and commands[-1][3:] == ["install", "-q", "xgrammar==0.2.1"]
    made = len(commands)
    assert not installer.install_missing("0.5.19", wheel, "uvloop")  # not a requirement of the version
    assert not installer.install_missing("0.5.19", wheel, "torch")  # the machine's torch stays
    assert len(commands) == made


def test_the_source_tree_installed_into_each_environment_is_this_checkout():
    """It was the `harness` folder once the module moved into `harness/triage/`: every run refused to start."""
    root = project_root()
    assert (root / "pyproject.toml").is_file() and (root / "harness" / "triage" / "versions.py").is_file()


def test_the_matrix_names_the_first_version_whose_hook_reads_an_attribute_on_every_call():
    """The seed's CI break: 0.5.21's hook starts by reading `self.token_to_kv_pool`, which a backend built
    without __init__ (SGLang's q8kv8 unit tests) lacks; 0.5.19 and 0.5.20 read it only on the sparse path."""
    from harness.triage.versions import VersionResult, VersionsOutcome

    hook = "prepare_prefill_shared_read_snapshot"
    read = {"attribute": "token_to_kv_pool", "call_path": [hook], "file": "sglang/srt/layers/attention/x.py",
            "line": 2345}

    def report(reads):
        return {**CLEAN, "every_call_reads": {hook: reads, "shared_read_ends": []}}

    outcome = VersionsOutcome([VersionResult("0.5.19", PASS, "", report([])),
                               VersionResult("0.5.20", PASS, "", report([])),
                               VersionResult("0.5.21", PASS, "", report([read])),
                               VersionResult("0.5.22", PASS, "", report([read]))], None, "0.5.22")
    [first] = outcome.first_every_call_reads()
    assert first["version"] == "0.5.21" and first["attribute"] == "token_to_kv_pool" and first["line"] == 2345
    rows = outcome.matrix()
    assert [r["every_call_reads"][hook] for r in rows] == [[], [], ["token_to_kv_pool"], ["token_to_kv_pool"]]
    assert rows[0]["contract"] == 0 and rows[0]["findings"] == 0 and rows[0]["cases"] == 5
