"""Benchmarks for affidavit. Each writes its own section of ``docs/PERFORMANCE.md``."""
