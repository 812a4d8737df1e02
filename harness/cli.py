"""`python -m harness`: run a campaign, replay a finding, explore every interleaving, run the mutant table.

Exit codes: 0 nothing found, 1 something found, 2 bad usage or configuration, 3 broken environment,
4 interrupted (SIGINT or SIGTERM) before anything was found: the report holds the cases so far,
5 the harness's own failure (not the system under test's), with where it happened.
Defaults can be set under [tool.dsv4-harness] in pyproject.toml (target, semantics, profile,
report-dir); the command line wins.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
import traceback
from importlib.metadata import PackageNotFoundError, version
from typing import Optional

from harness.commands.parsers import PARSERS, HarnessParser
from harness.errors import ExitCode, HarnessError, describe_internal_error
from harness.project_config import find_pyproject, project_defaults

# The subcommands by name: the module whose `run(args)` runs each (`harness.commands`, and `report`, which has
# no flag to check, beside its feature). This module builds the parser (`harness.commands.parsers`) and imports
# only the chosen command's module, after parsing: --help, --version and usage errors never load torch.
COMMANDS = {"run": "harness.commands.run", "replay": "harness.commands.replay", "explore": "harness.commands.explore",
            "triage": "harness.commands.triage", "csan": "harness.commands.csan", "mutants": "harness.commands.mutants",
            "sanitize": "harness.commands.sanitize", "report": "reports.cli", "merge": "harness.commands.merge",
            "nightly": "harness.commands.nightly"}


def harness_version() -> str:
    """The installed distribution's version; a checkout run without `pip install` has none to report."""
    try:
        return version("dsv4-race-harness")
    except PackageNotFoundError:
        return "unknown (not installed: run from a checkout)"


def build_parser(defaults: Optional[dict] = None) -> argparse.ArgumentParser:
    """`defaults`: argparse destinations -> values ([tool.dsv4-harness] in pyproject.toml), which
    replace the built-in defaults of every subcommand that has the option, in --help too."""
    parser = HarnessParser(prog="python -m harness", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {harness_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=HarnessParser)
    for add_parser in PARSERS.values():
        add_parser(sub)
    for subparser in sub.choices.values():
        known = {action.dest for action in subparser._actions}
        subparser.set_defaults(**{dest: value for dest, value in (defaults or {}).items() if dest in known})
    return parser


def main(argv=None) -> int:
    """The command's exit code (`ExitCode`), argparse's own included: 0 after --help or --version, 2 for a
    usage error it found."""
    if threading.current_thread() is threading.main_thread():
        # SIGINT stops every command, also one started ignoring it (a shell starts a script's background job so):
        # Python installs its KeyboardInterrupt handler only where SIGINT was not ignored, and `run` installs its own.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            args = build_parser(project_defaults(find_pyproject())).parse_args(argv)
        except SystemExit as exc:
            return exc.code
        return importlib.import_module(COMMANDS[args.command]).run(args)
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
