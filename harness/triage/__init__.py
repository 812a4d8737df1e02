"""`python -m harness triage`'s two halves that are not a campaign:

- `static.py`: which classes a target's triage checks, and `triage --static-only`;
- `versions.py`: `triage --versions`, each sglang version in its own environment.

The checks themselves are `harness.contracts`, on the ground floor; the command is `harness.commands.triage`.
"""
