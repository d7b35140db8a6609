"""Time-ordered identifiers in the UUIDv7 layout (RFC 9562).

48 bits of Unix milliseconds, then a 12-bit counter that keeps ids generated in the same
millisecond by this process strictly increasing, then 62 random bits. Ids sort by creation time
as strings, which keeps B-tree inserts at the right-hand edge of the index.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def _uuid7_int() -> int:
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave room to count up
        else:
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    return (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand


def uuid7() -> uuid.UUID:
    """A new time-ordered UUID (version 7)."""
    return uuid.UUID(int=_uuid7_int())


def new_job_id() -> str:
    """A new job id: the canonical hyphenated form of a UUIDv7."""
    return str(uuid7())


def new_event_id() -> str:
    """A new event id: 32 lowercase hex digits of a UUIDv7."""
    return f"{_uuid7_int():032x}"


def new_attempt_id() -> str:
    """A new attempt id for one claim (lease) of a job."""
    return f"{_uuid7_int():032x}"
