"""Checking a recorded SHA-256 of canonical JSON against a value, fast."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from affidavit.core.canonical import canonical
from affidavit.core.errors import AffidavitError


def canonical_hash_matches(value: Any, recorded: str) -> bool:
    """Whether ``recorded`` is hex(SHA-256(JCS(value))).

    Sorted-key orjson output equals JCS for most values and costs a fraction of the full
    encoder; when its digest matches, those bytes *are* the canonical ones (the writer hashed
    exactly those). Only on a mismatch is the RFC 8785 encoder consulted: floats and keys outside
    the Basic Multilingual Plane are where the two differ.
    """
    try:
        fast = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        fast = b""
    if hashlib.sha256(fast).hexdigest() == recorded:
        return True
    try:
        return hashlib.sha256(canonical(value)).hexdigest() == recorded
    except AffidavitError:
        return False
