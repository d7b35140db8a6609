"""Verification Mode: read-only proofs over a stored job (ARCHITECTURE.md)."""
