"""Thin: the fixtures live in the `fixtures` plugins (registered by the pytest11 entry points)."""

import sys

PLUGINS = ("fixtures.plugin", "fixtures.gpu_workers", "fixtures.telemetry", "fixtures.reporting", "fixtures.sharding")

# From a checkout without `pip install .` the entry points are absent: load the plugins from here.
pytest_plugins = [name for name in PLUGINS if name not in sys.modules]
