"""The subcommands of `python -m harness`: their options in `parsers` (which imports no torch), and one
module each with its `run(args)`.

`harness.cli` builds the parser from `parsers` and imports only the chosen command's module. The
subcommands that are a whole feature elsewhere keep their work beside that feature: `sanitize`
(`harness.sanitizer.cli`), `merge` (`reports.merge`) and `nightly` (`harness.nightly`) have a module here
all the same, which checks their flags and names them (the library names its parameters, never a flag);
`report`, which has no flag to check, runs from `reports.cli`.
"""
