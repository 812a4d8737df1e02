"""The interface contracts a build must keep, checked without running it:

- `objects.py`: on the objects as built (every `self.X` an entry point reads exists);
- `source.py`: on the source (attributes a class reads but never assigns).

Nothing here knows a target or SGLang (SGLang's module list is `harness.sglang_target.classes`) and
nothing imports the harness, so the package sits on the ground floor (DESIGN.md, "Layers"): the sglang
target's `contract` oracle and `python -m harness triage` both use it from above.
"""
