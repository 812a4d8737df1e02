"""Report writers: every report file is written atomically."""
