"""`python -m harness csan`: PyTorch's CUDA stream sanitizer (CSAN) as a second opinion on a campaign (CUDA only)."""

from __future__ import annotations

from pathlib import Path

from harness.commands.options import check_target_semantics, target_spec_of
from harness.csan import second_opinion_campaign
from harness.errors import ExitCode
from reports.schema import CSAN
from reports.writers import write_report


def run(args) -> int:
    target_spec = target_spec_of(args)
    target = target_spec.load()
    semantics = check_target_semantics(target, args.semantics)
    summary = second_opinion_campaign(target, examples=args.examples, semantics=semantics,
                                      target_spec=target_spec)
    summary.update(target=target_spec.spec, mutant=target_spec.mutant, semantics=semantics)
    write_report(Path(args.report_dir) / CSAN, summary)
    print(f"{summary['cases']} cases ({summary['graph_cases']} with graph replays), judged by our tracker, the "
          f"differential oracle and CSAN: {summary['verdicts']}; {summary['differential_findings']} differential")
    for d in summary["disagreements"]:
        print(f"  [{d['verdict']}] {d['explanation'] or 'UNEXPLAINED'}: {d['case']}")
        print(f"    replay: {d['replay']}")
    print(f"report: {Path(args.report_dir) / CSAN}")
    found = summary["differential_findings"] or any(v != "agree-clean" for v in summary["verdicts"])
    return ExitCode.FOUND if found else ExitCode.OK
