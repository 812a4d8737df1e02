"""`python -m harness`: run a campaign, replay a finding, explore every interleaving, run the mutant table.

Exit codes: 0 nothing found, 1 something found, 2 bad usage or configuration, 3 broken environment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import HarnessError, InvalidArgument
from harness import nightly
from harness.sanitizer import cli as sanitize_cli
from reports import cli as report_cli

EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_ENV = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors exit 2, as ours do
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(p):
        p.add_argument("--target", default="reference", help="reference | sglang | MODULE:FACTORY")
        p.add_argument("--device", default="auto", help="cpu | cuda | auto (default)")
        p.add_argument("--mutant", default=None, help="run against one seeded bug of the corpus")
        p.add_argument("--oracles", default=None,
                       help="comma-separated subset of: differential, happens-before, policy, float64, kv, execution, "
                            "reference, contract")

    run = sub.add_parser("run", help="run a fuzz campaign (the main job)")
    common(run)
    run.add_argument("--examples", type=int, default=None)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--profile", default="ci", help="dev | ci | nightly")
    run.add_argument("--semantics", default="0.5.23", help="pr | 0.5.23")
    run.add_argument("--report-dir", default="harness-report")
    run.add_argument("--no-shrink", action="store_true", help="report the first failing case as drawn")
    run.add_argument("--isolate", default="auto",
                     help="judge each case in a child process with this timeout in seconds, so a crash or hang is a "
                          "finding: SECONDS | off | auto (default: 120 on cuda, off on cpu)")
    run.add_argument("--from-db", action="store_true",
                     help="replay the seed cases and the failures stored in REPORT_DIR/examples (a nightly run's database)")

    replay = sub.add_parser("replay", help="replay one finding exactly")
    common(replay)
    replay.add_argument("--case", required=True, help="the case as JSON, or @FILE")
    replay.add_argument("--schedule", default="adversarial", help="adversarial | random:SEED | forced:CHOICES")

    explore = sub.add_parser("explore", help="try every interleaving the events allow (CPU simulator)")
    common(explore)
    explore.add_argument("--case", required=True, help="the case as JSON, or @FILE")
    explore.add_argument("--bound", type=int, default=500, help="stop after this many interleavings")

    triage = sub.add_parser("triage", help="interface contracts on the built backend, then a short campaign")
    common(triage)
    triage.add_argument("--examples", type=int, default=50)
    triage.add_argument("--semantics", default="0.5.23", help="pr | 0.5.23 | auto (what the target implements)")
    triage.add_argument("--report-dir", default="harness-report")
    triage.add_argument("--versions", default=None,
                        help="comma-separated sglang versions from PyPI: triage each in its own environment and "
                             "report the first failing one")
    triage.add_argument("--cache-dir", default=None, help="with --versions: wheels and environments "
                                                          "(default: REPORT_DIR/envs)")
    triage.add_argument("--bisect", action="store_true",
                        help="with --versions: run as few versions as a binary search needs")
    triage.add_argument("--missing-backend-fails", action="store_true",
                        help="with --versions: a version without the DSV4 backend module counts as failing")
    triage.add_argument("--static-only", action="store_true",
                        help="only the check on the source (no built object, no campaign); with --target sglang it "
                             "also runs on versions the target cannot drive")

    csan = sub.add_parser("csan", help="CUDA only: PyTorch's CSAN as a second opinion, and where it disagrees")
    csan.add_argument("--target", default="reference", help="reference | sglang | MODULE:FACTORY")
    csan.add_argument("--mutant", default=None, help="run against one seeded bug of the corpus")
    csan.add_argument("--examples", type=int, default=100)
    csan.add_argument("--semantics", default="0.5.23", help="pr | 0.5.23")
    csan.add_argument("--report-dir", default="harness-report")

    mutants = sub.add_parser("mutants", help="run the clean reference and every seeded bug: the kill table")
    mutants.add_argument("--device", default="cpu")
    mutants.add_argument("--examples", type=int, default=200)
    mutants.add_argument("--semantics", default="0.5.23", help="pr | 0.5.23")
    mutants.add_argument("--report-dir", default="harness-report")
    mutants.add_argument("--only", default=None, help="comma-separated mutant names")
    sanitize_cli.add_parser(sub)
    report_cli.add_parser(sub)
    nightly.add_parser(sub)
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        commands = {"run": cmd_run, "replay": cmd_replay, "explore": cmd_explore, "mutants": cmd_mutants,
                    "triage": cmd_triage, "csan": cmd_csan, "sanitize": sanitize_cli.run,
                    "report": report_cli.run, "nightly": nightly.run}
        return commands[args.command](args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def _semantics(value: str) -> str:
    from harness.case import SEMANTICS

    if value not in SEMANTICS:
        raise InvalidArgument(f"--semantics={value!r} is not one of: {', '.join(SEMANTICS)}")
    return value


def _load_case(text: str):
    from harness.case import Case

    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise InvalidArgument(f"--case {text}: no such file")
        text = path.read_text()
    return Case.from_json(text)


def _progress(total: int):
    """A rich progress bar on a terminal, nothing otherwise."""
    if not sys.stderr.isatty():
        return None, (lambda r: None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), transient=True)
    task = progress.add_task("cases", total=total)
    return progress, (lambda r: progress.update(task, completed=r.cases))


def cmd_run(args) -> int:
    from harness.campaign import PROFILES, run_campaign
    from harness.device import resolve_device
    from harness.engine import parse_oracles
    from harness.target import load_target
    from harness.telemetry import TelemetryWindow, annotate_summary
    from reports.writers import write_json_atomically

    semantics = _semantics(args.semantics)
    device = resolve_device(args.device)
    target = load_target(args.target, mutant=args.mutant)
    report_dir = Path(args.report_dir)
    if args.profile not in PROFILES:
        raise InvalidArgument(f"--profile={args.profile!r} is not one of: {', '.join(PROFILES)}")
    total = args.examples or PROFILES[args.profile]["max_examples"]
    isolate_s = _isolate(args.isolate, device)
    progress, update = _progress(total)
    if progress:
        progress.start()
    try:
        with TelemetryWindow(required=device == "cuda") as window:
            result = run_campaign(target, target_spec=args.target, device=device, semantics=semantics,
                                  examples=args.examples, seed=args.seed, profile=args.profile,
                                  database_dir=report_dir / "examples", mutant=args.mutant, on_case=update,
                                  shrink=not args.no_shrink, oracles=parse_oracles(args.oracles),
                                  from_db=args.from_db, isolate_s=isolate_s)
    finally:
        if progress:
            progress.stop()
    summary = annotate_summary(result.summary(), window)
    summary["mutant"] = args.mutant
    summary_name = "replay-summary.json" if args.from_db else "summary.json"  # a replay keeps the nightly's own
    write_json_atomically(report_dir / summary_name, summary)
    rate = summary["cases_per_second"]
    print(f"{result.cases} cases on {device} ({semantics}, target {target.name}) in {result.duration_s:.1f}s"
          f" ({rate} cases/s): {len(result.findings)} finding(s)")
    for finding in result.findings:
        print(f"  [{finding.oracle}/{finding.kind}] {finding.message}")
    if result.minimal:
        print(f"  minimal case: {result.minimal.case.summary()}")
        print(f"  found after {result.first_detection_examples} example(s), {result.first_detection_seconds:.2f}s")
        print(f"  replay: {result.minimal.replay}")
    print(f"summary: {report_dir / summary_name}")
    _render(report_dir)
    return EXIT_FOUND if result.findings else EXIT_OK


def _isolate(value: str, device: str):
    if value == "auto":
        return 120.0 if device == "cuda" else None
    if value == "off":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise InvalidArgument(f"--isolate={value!r}: a timeout in seconds > 0, off, or auto")
    return seconds


def _render(report_dir: Path) -> None:
    """Every command leaves a page beside its JSON (the folder's verdict is printed by `harness report`)."""
    from reports.cli import render_folder

    render_folder(report_dir)
    print(f"page: {report_dir / 'index.html'}")


def cmd_replay(args) -> int:
    from harness.device import resolve_device
    from harness.engine import parse_oracles, run_case

    from harness.target import load_target

    case = _load_case(args.case)
    device = resolve_device(args.device)
    target = load_target(args.target, mutant=args.mutant)
    result = run_case(target, case, device, schedule=args.schedule, target_spec=args.target, mutant=args.mutant,
                      oracles=parse_oracles(args.oracles))
    print(f"case: {case.summary()}")
    print(f"schedule: {args.schedule}; executed order: forced:{result.overlapped.schedule}")
    for line in result.overlapped.trace:
        print(f"    {line}")
    for finding in result.findings:
        print(f"[{finding.oracle}/{finding.kind}] {finding.message}")
    print(f"{len(result.findings)} finding(s)")
    return EXIT_FOUND if result.findings else EXIT_OK


def cmd_explore(args) -> int:
    from harness.device import resolve_device
    from harness.engine import explore
    from harness.target import load_target

    if resolve_device(args.device) != "cpu":
        raise InvalidArgument("explore runs on the CPU simulator only: use --device cpu")
    if args.bound < 1:
        raise InvalidArgument(f"--bound={args.bound}: must be >= 1")
    case = _load_case(args.case)
    target = load_target(args.target, mutant=args.mutant)
    outcome = explore(target, case, bound=args.bound, target_spec=args.target, mutant=args.mutant)
    print(f"explored {outcome.explored} interleaving(s){' (bound reached)' if outcome.truncated else ' (all)'}; "
          f"{len(outcome.failing)} with findings")
    for schedule, finding in outcome.failing[:10]:
        print(f"  forced:{schedule}  [{finding.oracle}/{finding.kind}] {finding.message}")
    return EXIT_FOUND if outcome.failing else EXIT_OK


def cmd_mutants(args) -> int:
    from harness.corpus import run_kill_table

    semantics = _semantics(args.semantics)
    code = run_kill_table(device=args.device, examples=args.examples, semantics=semantics,
                          report_dir=Path(args.report_dir), only=args.only)
    _render(Path(args.report_dir))
    return code


def cmd_triage(args) -> int:
    from dataclasses import asdict

    from harness import static_contracts as static_check
    from harness.campaign import run_campaign
    from harness.case import Batch, Case, Request
    from harness.device import make_device, resolve_device
    from harness.engine import parse_oracles
    from harness.target import load_target
    from harness.triage import ENTRY_POINTS, check_object
    from reports.writers import write_json_atomically

    if args.versions is not None:
        from harness.versions import triage_versions

        return triage_versions(args)
    if args.static_only:
        return static_check.static_triage(args)
    device = resolve_device(args.device)
    target = load_target(args.target, mutant=args.mutant)
    semantics = (getattr(target, "semantics_supported", ("0.5.23",))[0] if args.semantics == "auto"
                 else _semantics(args.semantics))
    session = target.open(Case(semantics=semantics, batches=(Batch(requests=(Request(3, 5),)),)), make_device(device))
    breaks = check_object(session.model_runner.attn_backend, getattr(session, "contract_entry_points", ENTRY_POINTS))
    for b in breaks:
        print(f"[contract] {b}")
    static = static_check.static_section(static_check.check_classes(static_check.triage_classes(session)))
    result = run_campaign(target, target_spec=args.target, device=device, semantics=semantics,
                          examples=args.examples, mutant=args.mutant, oracles=parse_oracles(args.oracles))
    for finding in result.findings:
        print(f"[{finding.oracle}/{finding.kind}] {finding.message}")
    if result.minimal:
        print(f"  replay: {result.minimal.replay}")
    report = {"target": getattr(target, "name", args.target), "device": device, "semantics": semantics,
              "contract_breaks": [asdict(b) for b in breaks], **static, "campaign": result.summary()}
    write_json_atomically(Path(args.report_dir) / "triage.json", report)
    print(f"{len(breaks)} contract break(s), {len(static['static_breaks'])} static break(s) in "
          f"{len(static['static_classes'])} classes, {len(result.findings)} finding(s) in {result.cases} cases; "
          f"report: {Path(args.report_dir) / 'triage.json'}")
    return EXIT_FOUND if breaks or static["static_breaks"] or result.findings else EXIT_OK


def cmd_csan(args) -> int:
    from harness.csan import second_opinion_campaign
    from harness.target import load_target
    from reports.writers import write_json_atomically

    semantics = _semantics(args.semantics)
    target = load_target(args.target, mutant=args.mutant)
    summary = second_opinion_campaign(target, examples=args.examples, semantics=semantics, target_spec=args.target,
                                      mutant=args.mutant)
    summary.update(target=args.target, mutant=args.mutant, semantics=semantics)
    write_json_atomically(Path(args.report_dir) / "csan.json", summary)
    print(f"{summary['cases']} cases ({summary['graph_cases']} with graph replays), judged by our tracker, the "
          f"differential oracle and CSAN: {summary['verdicts']}; {summary['differential_findings']} differential")
    for d in summary["disagreements"]:
        print(f"  [{d['verdict']}] {d['explanation'] or 'UNEXPLAINED'}: {d['case']}")
        print(f"    replay: {d['replay']}")
    print(f"report: {Path(args.report_dir) / 'csan.json'}")
    found = summary["differential_findings"] or any(v != "agree-clean" for v in summary["verdicts"])
    return EXIT_FOUND if found else EXIT_OK
