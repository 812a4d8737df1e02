"""Every subcommand's options, and the parser that holds them, without what runs the commands.

`harness.cli` builds the parser from here and imports the module that runs the chosen command only
after parsing: `--help`, `--version` and every usage error argparse finds are answered without
loading torch (about 4 s). Each value is checked as it is parsed (`harness.validation`,
`reports.writers.report_folder`), so a bad one is refused before any work, naming the option.
"""

from __future__ import annotations

import argparse
import sys

from harness.case import SEMANTICS, Flags
from harness.errors import ExitCode
from harness.choices import AUTO_JOBS_MAX, NIGHTLY_STEPS, PROFILES, SANITIZER_TARGETS, SANITIZER_TOOLS
from harness.progress import PROGRESS_EVERY_S
from harness.validation import (MAX_EXAMPLES, count_or_auto, integer, names_from, one_of, positive_seconds, seconds,
                                target_spec, timeout_or_off)
from reports.writers import report_folder


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, once; a required option's with "(required)"; an
    option without a default (None, or [] for a repeatable one) says in its help what none means,
    never "(default: None)"."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings:  # a positional: its help says what it is, and what none means
            return text
        if action.required:
            return f"{text} (required)"
        if "%(default)" in text or "(default:" in text or action.default in (None, []):
            return text
        return super()._get_help_string(action)


class HarnessParser(argparse.ArgumentParser):
    """Usage errors exit 2, as ours do; every option's help ends with its default (`HelpFormatter`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE)



def add_common_options(p) -> None:
    """--target, --device, --mutant and --oracles: the options of every subcommand that judges cases."""
    p.add_argument("--target", type=target_spec, default="reference", help="reference | sglang | MODULE:FACTORY")
    p.add_argument("--device", type=one_of("cpu", "cuda", "auto"), default="auto",
                   help="cpu | cuda | auto (cuda when a GPU is visible)")
    p.add_argument("--mutant", default=None, help="run against one seeded bug of the corpus (mutants --list; "
                                                  "none given: the target as it is)")
    p.add_argument("--oracles", default=None,
                   help="comma-separated oracles to judge by (a name that is not registered is refused with the "
                        "registered ones; none given: all)")


def add_run(sub) -> None:
    parser = sub.add_parser("run", help="run a fuzz campaign (the main job)")
    add_common_options(parser)
    parser.add_argument("--examples", type=integer(1, MAX_EXAMPLES), default=None,
                        help="cases in all (none given: the profile's)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (none given: the profile's)")
    parser.add_argument("--profile", type=one_of(*PROFILES), default="ci",
                        help="dev (50 cases) | ci (200, derandomized) | nightly (5000)")
    parser.add_argument("--semantics", type=one_of(*SEMANTICS), default="0.5.23", help="pr | 0.5.23")
    parser.add_argument("--report-dir", type=report_folder, default="harness-report", help="the report folder")
    parser.add_argument("--overwrite", action="store_true", help="replace the campaign already in --report-dir")
    parser.add_argument("--no-shrink", action="store_true", help="report the first failing case as drawn")
    parser.add_argument("--without", default="", metavar="GATE[,GATE]",
                        help="gate switches the campaign never turns on (a deployment without HiCache, say): "
                             f"{', '.join(Flags.GATES)}; or a path under a gate it never takes (a release's known "
                             f"bug there): {', '.join(Flags.PATHS)} (a HiSparse case prefills dense)")
    parser.add_argument("--keep-going", type=integer(1, MAX_EXAMPLES), default=1, metavar="N",
                     help="collect up to N distinct failures (by oracle, kind and location), each shrunk, before "
                          "stopping")
    parser.add_argument("--no-seeds", action="store_true",
                     help="draw every case: skip the hand-written seed cases of the protocol's shapes")
    parser.add_argument("--isolate", type=timeout_or_off, default="auto",
                     help="judge each case in a child process with this timeout in seconds, so a crash or hang is a "
                          "finding: SECONDS | off | auto (120 on cuda or with --jobs N > 1, off otherwise)")
    parser.add_argument("--jobs", type=count_or_auto("cases judged at once"), default="auto", metavar="N|auto",
                        help="judge up to N cases at once, each in its own child process (isolated), this process "
                             "drawing the stream once; the count, the first detection and the shrunk case are those "
                             "of one case at a time. The children share this run's GPU: a case is mostly host work. "
                             f"auto: on cuda, one per two cores of each process's share, at most {AUTO_JOBS_MAX}; "
                             "on cpu, or with --isolate off, 1")
    parser.add_argument("--from-db", action="store_true",
                     help="replay the failures stored in REPORT_DIR/examples and any --example-db, then the seed cases")
    parser.add_argument("--shard", default="1/1", help="K/N: judge only part K of N of the case stream (reproducible, "
                                                    "disjoint; merge the parts with `harness merge`)")
    parser.add_argument("--workers", default="1", help="N | auto: N campaign processes, each on its own part of the "
                                                    "stream and pinned to its own GPU (auto: one per visible GPU on "
                                                    "cuda, one per core on cpu), merged into one report")
    parser.add_argument("--gpu-share", action="store_true",
                        help="with --device cuda, allow more --workers than GPUs: workers share the GPUs round robin "
                             "(a campaign is mostly host work, so a GPU serves several); with --workers auto, one "
                             "worker per two cores")
    parser.add_argument("--example-db", action="append", default=[], metavar="DIR|redis://HOST:PORT",
                     help="a shared example database, beside REPORT_DIR/examples: failures found here are saved "
                          "there, and failures saved there by other hosts replay here (repeatable; none given: "
                          "REPORT_DIR/examples only)")
    parser.add_argument("--progress-every", type=seconds, default=PROGRESS_EVERY_S, metavar="SECONDS",
                     help="off a terminal, a progress line this often")
    volume = parser.add_mutually_exclusive_group()
    volume.add_argument("-q", "--quiet", action="store_true", help="no progress output, only the result")
    volume.add_argument("-v", "--verbose", action="store_true", help="a line per case as well")


def add_replay(sub) -> None:
    parser = sub.add_parser("replay", help="replay one finding exactly")
    add_common_options(parser)
    parser.add_argument("--case", required=True, help="the case as JSON, or @FILE")
    parser.add_argument("--schedule", default="adversarial", help="adversarial | random:SEED | forced:CHOICES")


def add_explore(sub) -> None:
    parser = sub.add_parser("explore", help="try every interleaving the events allow (CPU simulator)")
    add_common_options(parser)
    parser.add_argument("--case", required=True, help="the case as JSON, or @FILE")
    parser.add_argument("--bound", type=integer(1, MAX_EXAMPLES), default=500, help="stop after this many interleavings")


def add_triage(sub) -> None:
    parser = sub.add_parser("triage", help="interface contracts on the built backend, then a short campaign")
    add_common_options(parser)
    parser.add_argument("--examples", type=integer(1, MAX_EXAMPLES), default=50, help="cases of the short campaign")
    parser.add_argument("--semantics", default="0.5.23", help="pr | 0.5.23 | auto (what the target implements)")
    parser.add_argument("--report-dir", type=report_folder, default="harness-report", help="the report folder")
    parser.add_argument("--versions", default=None,
                        help="comma-separated sglang versions from PyPI: triage each in its own environment and "
                             "report the first failing one (none given: the installed one only)")
    parser.add_argument("--cache-dir", default=None, help="with --versions: wheels and environments "
                                                          "(none given: REPORT_DIR/envs)")
    parser.add_argument("--bisect", action="store_true",
                        help="with --versions: run as few versions as a binary search needs")
    parser.add_argument("--missing-backend-fails", action="store_true",
                        help="with --versions: a version without the DSV4 backend module counts as failing")
    parser.add_argument("--static-only", action="store_true",
                        help="only the check on the source (no built object, no campaign); with --target sglang it "
                             "also runs on versions the target cannot drive")


def add_csan(sub) -> None:
    parser = sub.add_parser("csan", help="CUDA only: PyTorch's CSAN as a second opinion, and where it disagrees")
    parser.add_argument("--target", type=target_spec, default="reference", help="reference | sglang | MODULE:FACTORY")
    parser.add_argument("--mutant", default=None, help="run against one seeded bug of the corpus (mutants --list; "
                                                       "none given: the target as it is)")
    parser.add_argument("--examples", type=integer(1, MAX_EXAMPLES), default=100, help="cases")
    parser.add_argument("--semantics", type=one_of(*SEMANTICS), default="0.5.23", help="pr | 0.5.23")
    parser.add_argument("--report-dir", type=report_folder, default="harness-report", help="the report folder")


def add_mutants(sub) -> None:
    parser = sub.add_parser("mutants", help="run the clean reference and every seeded bug: the kill table")
    parser.add_argument("--device", type=one_of("cpu", "cuda"), default="cpu", help="cpu | cuda")
    parser.add_argument("--examples", type=integer(1, MAX_EXAMPLES), default=200, help="cases per campaign")
    parser.add_argument("--semantics", type=one_of(*SEMANTICS), default="0.5.23", help="pr | 0.5.23")
    parser.add_argument("--report-dir", type=report_folder, default="harness-report", help="the report folder")
    parser.add_argument("--overwrite", action="store_true", help="replace the kill table already in --report-dir")
    parser.add_argument("--only", default=None, help="comma-separated mutant names (none given: all)")
    parser.add_argument("--shard", default="1/1", help="K/N: part K of N of the mutants (the clean reference runs "
                                                        "in part 1)")
    parser.add_argument("--list", action="store_true", help="print the mutants, one a line, and exit")
    parser.add_argument("--no-seeds", action="store_true",
                         help="draw every case of each campaign: skip the hand-written seed cases")
    parser.add_argument("--seed", type=int, default=None,
                         help="hypothesis seed of every campaign (none given: the ci profile's fixed stream); another "
                              "seed shows whether a kill depends on one stream")


def add_sanitize(sub) -> None:
    p = sub.add_parser("sanitize", help="run our kernels and the planted bugs under compute-sanitizer")
    p.add_argument("cases", nargs="*", help="case names (none given: all); see the list in the error for a bad one")
    p.add_argument("--tool", type=one_of(*SANITIZER_TOOLS), default="all", help=" | ".join(SANITIZER_TOOLS))
    p.add_argument("--target", type=one_of(*SANITIZER_TARGETS), default="reference",
                   help=f"whose kernels: {' | '.join(SANITIZER_TARGETS)}")
    p.add_argument("--report-dir", type=report_folder, default="harness-report", help="the report folder")
    p.add_argument("--timeout", type=positive_seconds, default=300.0, help="wall-clock seconds per sanitized run")
    p.add_argument("--jobs", type=integer(1), default=1,
                   help="cases run at once per tool (tools always run one at a time); >1 inflates timings")


def add_report(sub) -> None:
    parser = sub.add_parser("report", help="re-render a report folder's index.html and JUnit files from its JSON")
    parser.add_argument("dir", help="the report folder (holding summary.json, mutants.json, ...)")


def add_merge(sub) -> None:
    parser = sub.add_parser("merge", help="merge the report folders of shards, workers or hosts into one, with one "
                                          "page")
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="the report folders to merge")
    parser.add_argument("--into", required=True, type=report_folder, metavar="DIR", help="the merged report folder")
    parser.add_argument("--overwrite", action="store_true", help="replace a merged folder that is already there")


def add_nightly(sub) -> None:
    parser = sub.add_parser("nightly", help="the nightly GPU job: pytest (one GPU per worker), a nightly campaign, "
                                            "the mutant table and the sanitizer run, into one report folder")
    parser.add_argument("--report-dir", type=report_folder, default="harness-report", help="the report folder, one for every step")
    parser.add_argument("--device", type=one_of("cuda", "cpu"), default="cuda",
                        help="cuda | cpu (a dry run of the same steps)")
    parser.add_argument("--examples", type=integer(1, MAX_EXAMPLES), default=None,
                        help="campaign size (none given: the nightly profile's)")
    parser.add_argument("--target", type=target_spec, default="reference",
                        help="what the cases and the campaign judge: reference | sglang | MODULE:FACTORY "
                             "([tool.dsv4-harness] target sets it)")
    parser.add_argument("--workers", type=count_or_auto("workers"), default="auto", metavar="N|auto",
                        help="the campaign's workers (auto: one per GPU) and the pytest step's xdist workers (auto: "
                             "one per core, sharing the GPUs)")
    parser.add_argument("--self-tests", action="store_true",
                        help="the pytest step runs the harness's own tests (tests/) beside the cases (cases/)")
    parser.add_argument("--semantics", type=one_of(*SEMANTICS), default="0.5.23", help="pr | 0.5.23")
    parser.add_argument("--skip", type=names_from(*NIGHTLY_STEPS), default="", help=f"comma-separated steps to leave out: {', '.join(NIGHTLY_STEPS)} "
                                                     "(none given: none)")
    parser.add_argument("--shard", default="1/1", help="K/N: this host's part of the suite, the campaign's case "
                                                       "stream and the mutants (the sanitizer runs in part 1); "
                                                       "merge the hosts' folders with `harness merge`")
    parser.add_argument("--seed", type=int, default=None, help="the campaign's seed; with --shard, the same on every "
                                                               "host (none given: a random one)")
    parser.add_argument("--example-db", action="append", default=[], metavar="DIR|redis://HOST:PORT",
                        help="the campaign's shared example database (repeatable; see `run --help`; none given: "
                             "REPORT_DIR/examples only)")
    parser.add_argument("--overwrite", action="store_true", help="replace the nightly already in --report-dir")
    parser.add_argument("--progress-every", type=seconds, default=PROGRESS_EVERY_S, metavar="SECONDS",
                        help="the campaign's progress line, off a terminal, this often")


# subcommand -> the function that adds its parser, in the order `--help` lists them
PARSERS = {"run": add_run, "replay": add_replay, "explore": add_explore, "triage": add_triage, "csan": add_csan,
           "mutants": add_mutants, "sanitize": add_sanitize, "report": add_report, "merge": add_merge,
           "nightly": add_nightly}
