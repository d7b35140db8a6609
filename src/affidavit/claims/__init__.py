"""Claims and trust: check agent claims by running the check (ARCHITECTURE.md)."""
