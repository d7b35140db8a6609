"""The foundation: canonical JSON, hashes, ids, plans, events, errors. Imports nothing of ours
outside this package."""
