"""`python -m harness triage`: is a build's backend the object the runners expect?

- `objects.py`: the interface checked on the objects as built (every `self.X` an entry point reads exists);
- `source.py`: the source analyser (attributes a class reads but never assigns), nothing SGLang-specific
  (SGLang's module list is `harness.sglang_target.classes`);
- `static.py`: which classes a target's triage checks, and `triage --static-only`;
- `versions.py`: `triage --versions`, each sglang version in its own environment.

The modules sit on different floors (DESIGN.md, "Layers"): the analysers below the targets (the sglang
target's `contract` oracle uses the source analyser), the two commands' halves above them. This module
imports none of them.
"""
