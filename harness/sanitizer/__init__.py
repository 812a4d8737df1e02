"""compute-sanitizer runs of our kernels and of planted bugs, parsed from the tool's XML, with no silent pass."""
