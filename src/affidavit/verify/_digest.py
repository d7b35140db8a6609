"""Checking a recorded SHA-256 of canonical JSON against a parsed value, fast."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from affidavit.core.canonical import canonical_of_parsed, canonical_parsed
from affidavit.core.errors import AffidavitError


def canonical_hash_matches(value: Any, recorded: str) -> bool:
    """Whether ``recorded`` is hex(SHA-256(JCS(value))), ``value`` as a JSON parser returned it.

    Sorted-key orjson output equals JCS for most values and costs a fraction of the full
    encoder; when its digest matches, those bytes *are* the canonical ones (the writer hashed
    exactly those). Only on a mismatch are the JCS bytes taken, through
    :func:`~affidavit.core.canonical.canonical_parsed`: without a double or a key outside the
    Basic Multilingual Plane (where the two encoders differ) that is the same sorted-key output,
    and a mismatch costs no walk over the value.
    """
    try:
        fast = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        fast = b""
    if hashlib.sha256(fast).hexdigest() == recorded:
        return True
    try:
        return hashlib.sha256(canonical_parsed(value)).hexdigest() == recorded
    except AffidavitError:
        pass
    try:  # an integer beyond ±(2^53-1): an integral double the parser read as an int
        jcs = canonical_of_parsed(value)
    except AffidavitError:
        return False
    return hashlib.sha256(jcs).hexdigest() == recorded
