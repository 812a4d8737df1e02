"""A target module that is there but cannot import its own dependency: a broken environment (exit 3),
not a usage error, for `--target target_needing_a_missing_package:factory`."""

import no_such_package_anywhere  # noqa: F401

factory = None
