"""Runtime: plan execution, workers, the invocation ledger, replay (ARCHITECTURE.md)."""
