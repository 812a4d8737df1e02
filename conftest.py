"""Thin: the fixtures live in the `fixtures` plugin (registered by the pytest11 entry point)."""

import sys

if "fixtures.plugin" not in sys.modules:  # running from a checkout without `pip install .`
    pytest_plugins = ["fixtures.plugin"]
