"""`python -m harness`: run a campaign, replay a finding, explore every interleaving, run the mutant table.

Exit codes: 0 nothing found, 1 something found, 2 bad usage or configuration, 3 broken environment,
4 interrupted (SIGINT or SIGTERM) before anything was found: the report holds the cases so far,
5 the harness's own failure (not the system under test's), with where it happened.
Defaults can be set under [tool.dsv4-harness] in pyproject.toml (target, semantics, profile,
report-dir); the command line wins.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Optional

from harness import nightly
from harness.commands import csan, explore, mutants, replay, run, triage
from harness.commands.options import HarnessParser
from harness.errors import ExitCode, HarnessError, describe_internal_error
from harness.project_config import find_pyproject, project_defaults
from harness.sanitizer import cli as sanitize_cli
from reports import cli as report_cli
from reports import merge

# The subcommands by name. This module only builds the parser and dispatches: each subcommand's options and
# its run are in its own module, `add_parser(sub)` and `run(args)` (`harness.commands`, and the four that
# live beside their feature).
COMMANDS = {"run": run, "replay": replay, "explore": explore, "triage": triage, "csan": csan, "mutants": mutants,
            "sanitize": sanitize_cli, "report": report_cli, "merge": merge, "nightly": nightly}


def build_parser(defaults: Optional[dict] = None) -> argparse.ArgumentParser:
    """`defaults`: argparse destinations -> values ([tool.dsv4-harness] in pyproject.toml), which
    replace the built-in defaults of every subcommand that has the option, in --help too."""
    parser = HarnessParser(prog="python -m harness", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=HarnessParser)
    for command in COMMANDS.values():
        command.add_parser(sub)
    for subparser in sub.choices.values():
        known = {action.dest for action in subparser._actions}
        subparser.set_defaults(**{dest: value for dest, value in (defaults or {}).items() if dest in known})
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser(project_defaults(find_pyproject())).parse_args(argv)
        return COMMANDS[args.command].run(args)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # SIGINT in a command that has no case stream to stop between (replay, explore)
        print("\ninterrupted by SIGINT before the command finished: it wrote nothing", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001  the harness's own bug: reported as such, never as exit 1 ("found")
        traceback.print_exc()
        print(describe_internal_error(exc), file=sys.stderr)
        return ExitCode.INTERNAL
