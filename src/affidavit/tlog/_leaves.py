"""What a leaf of the log is logged under: its record id (the leaf's ``job_id`` field). The log
holds one leaf per record id, and the first one wins (docs/transparency.md)."""

from __future__ import annotations

import json

MAX_LEAF_BYTES = 0xFFFF  # an entry bundle's length prefix is 16 bits


def record_id(leaf: bytes) -> str | None:
    """The id ``leaf`` is logged under: its ``job_id`` field (``None`` for a leaf that is not a
    JSON object with a string ``job_id``, or that an entry bundle cannot hold)."""
    if len(leaf) > MAX_LEAF_BYTES:
        return None
    try:
        value = json.loads(leaf.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    found = value.get("job_id") if isinstance(value, dict) else None
    return found if isinstance(found, str) else None
