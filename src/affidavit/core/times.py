"""Times as the record writes them: RFC 3339 UTC with microseconds, read and written exactly
as integers of microseconds since the epoch (no float in between)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_us(micros: int) -> str:
    """``micros`` since the epoch as RFC 3339 UTC with microseconds (exact both ways)."""
    second, fraction = divmod(micros, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)) + f".{fraction:06d}Z"


def parse_iso_us(text: str) -> int:
    """An RFC 3339 time (with its offset) as µs since the epoch, exactly: the inverse of
    :func:`iso_us`.

    Raises:
        ValueError: not such a time, or one without its offset.
    """
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError("a time without its offset")
    delta = moment - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
