"""The subcommands of `python -m harness`, one module each: its `add_parser(sub)` and its `run(args)`.

`harness.cli` only builds the parser from these and dispatches. The subcommands that are a whole feature
elsewhere keep their parser and run beside that feature: `sanitize` (`harness.sanitizer.cli`), `report`
(`reports.cli`), `merge` (`reports.merge`) and `nightly` (`harness.nightly`).
"""
