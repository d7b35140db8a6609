"""Time-ordered identifiers in the UUIDv7 layout (RFC 9562).

48 bits of Unix milliseconds, then a 12-bit counter that keeps ids generated in the same
millisecond by this process strictly increasing, then 62 random bits. Ids sort by creation time
as strings, which keeps B-tree inserts at the right-hand edge of the index.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0
# Random bits come from the OS in blocks (one system call per 512 ids, not one per id).
_BLOCK = 4096
_pool = b""
_pos = _BLOCK


def _reset_after_fork() -> None:
    """A forked child must not replay its parent's random block or clock state."""
    global _pool, _pos, _last_ms, _counter, _lock
    _lock = threading.Lock()
    _pool, _pos, _last_ms, _counter = b"", _BLOCK, 0, 0


os.register_at_fork(after_in_child=_reset_after_fork)

_RAND_MASK = (1 << 62) - 1


def _uuid7_int() -> int:
    return _uuid7_ints(1)[0]


def _uuid7_ints(count: int) -> list[int]:
    """``count`` consecutive UUIDv7 ints under one lock and one clock read."""
    global _last_ms, _counter, _pool, _pos
    out: list[int] = []
    with _lock:
        ms_now = time.time_ns() // 1_000_000
        for _ in range(count):
            if _pos >= _BLOCK:
                _pool, _pos = os.urandom(_BLOCK), 0
            rand = int.from_bytes(_pool[_pos : _pos + 8], "big")
            _pos += 8
            if ms_now > _last_ms:
                _last_ms = ms_now
                _counter = rand >> 54  # 10 random bits: leaves room to count up within this ms
            else:
                _counter += 1
                if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                    _last_ms += 1
                    _counter = 0
            out.append(
                (_last_ms << 80)
                | (0x7 << 76)
                | (_counter << 64)
                | (0b10 << 62)
                | (rand & _RAND_MASK)
            )
    return out


# The form of the ids this module makes: 32 lowercase hex digits of a UUIDv7 (version nibble 7,
# variant bits 10). Event ids of this form are unique by construction (strictly increasing within
# a process; 62 random bits apart across processes), so the database keeps a unique key only for
# event ids of any other form (migration 6: the key is partial), and the store refuses a
# caller-supplied event id of this form.
GENERATED_ID = re.compile(r"[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}")


def is_generated_id(value: str) -> bool:
    """Whether ``value`` has the form of the ids :func:`new_event_ids` makes."""
    return GENERATED_ID.fullmatch(value) is not None


def new_event_ids(count: int) -> list[str]:
    """``count`` new event ids, increasing, cheaper than ``count`` calls of :func:`new_event_id`."""
    return [f"{n:032x}" for n in _uuid7_ints(count)]


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
