"""The subcommands of `python -m harness`: their options in `parsers` (which imports no torch), and one
module each with its `run(args)`.

`harness.cli` builds the parser from `parsers` and imports only the chosen command's module. The
subcommands that are a whole feature elsewhere keep their run beside that feature: `sanitize`
(`harness.sanitizer.cli`), `report` (`reports.cli`), `merge` (`reports.merge`) and `nightly`
(`harness.nightly`).
"""
