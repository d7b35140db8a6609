"""Rates written ``N/PERIOD``: at most ``N`` events in any sliding window of ``PERIOD``.

``PERIOD`` is a number and a unit (``ms``, ``s``, ``m``, ``h``, ``d``); the number may be left
out for one unit (``5/s`` is ``5/1s``). Queues (``rate="100/60s"``) and tool limits
(``Limit(rate="50/10s")``) read their rates with :func:`parse_rate`, so one syntax holds
everywhere. :func:`allowed_starts` is the sliding-window arithmetic a limiter applies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

# The longest text parse_rate reads: a rate is short; longer input is refused unread.
MAX_RATE_TEXT = 64
# Bounds that keep a window's arithmetic exact and its count queryable.
MAX_COUNT = 1_000_000_000
MAX_PERIOD_SECONDS = 366 * 86400.0
MIN_PERIOD_SECONDS = 0.001

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"\A\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|m|h|d)\s*\Z")
_HINT = (
    "Write a rate as N/PERIOD: a count, a slash, a period with its unit, e.g. 100/60s, 5/1s, 10/1m."
)


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` events in any sliding window of ``period_seconds``."""

    count: int
    period_seconds: float

    def __str__(self) -> str:
        return f"{self.count}/{self.period_seconds:g}s"

    def per_second(self) -> float:
        return self.count / self.period_seconds


def parse_rate(text: str) -> Rate:
    """``text`` (``N/PERIOD``, e.g. ``100/60s``) as a :class:`Rate`.

    Raises:
        ValueError: not a rate (with a hint), a count below 1 or a period outside
            1 ms .. 366 days.
    """
    if not isinstance(text, str):
        raise ValueError(f"a rate is text, not {type(text).__name__}. {_HINT}")
    if len(text) > MAX_RATE_TEXT:
        raise ValueError(f"a rate is at most {MAX_RATE_TEXT} characters. {_HINT}")
    found = _RATE.match(text)
    if found is None:
        raise ValueError(f"not a rate: {text!r}. {_HINT}")
    count = int(found.group(1))
    amount = float(found.group(2)) if found.group(2) is not None else 1.0
    period = amount * _UNITS[found.group(3)]
    if not 1 <= count <= MAX_COUNT:
        raise ValueError(f"a rate's count is 1 .. {MAX_COUNT}, not {count}. {_HINT}")
    if not (math.isfinite(period) and MIN_PERIOD_SECONDS <= period <= MAX_PERIOD_SECONDS):
        raise ValueError(f"a rate's period is 1 ms .. 366 days, not {text!r}. {_HINT}")
    return Rate(count, period)


def window_start(rate: Rate, now: float) -> float:
    """The start of the window that ends at ``now``: starts after it count (``>``)."""
    return now - rate.period_seconds


def allowed_starts(rate: Rate, starts: Sequence[float], now: float) -> int:
    """How many more starts ``rate`` allows at ``now``, given the times of the starts before
    (any order): the window ``(now - period, now]`` holds at most ``count`` starts."""
    begin = window_start(rate, now)
    used = sum(1 for t in starts if begin < t <= now)
    return max(0, rate.count - used)


def worst_window(rate: Rate, starts: Sequence[float]) -> tuple[int, float | None]:
    """The most starts any window of ``rate``'s period holds, and when that window ends (at a
    start: a window holding the most ends at one of them). ``(0, None)`` for no starts."""
    ordered = sorted(starts)
    best, at = 0, None
    first = 0
    for last, end in enumerate(ordered):
        while ordered[first] <= end - rate.period_seconds:
            first += 1
        if last - first + 1 > best:
            best, at = last - first + 1, end
    return best, at


def window_starts(rate: Rate, starts: Sequence[float], end: float) -> list[int]:
    """The indexes of the ``starts`` in the window ``(end - period, end]``, in time order."""
    begin = window_start(rate, end)
    return sorted((i for i, t in enumerate(starts) if begin < t <= end), key=lambda i: starts[i])


def peak_overlap(intervals: Sequence[tuple[float, float]]) -> tuple[int, float | None, list[int]]:
    """The most ``[start, end)`` intervals holding at one instant, the first instant they do and
    the indexes of those intervals. An interval ending when another starts does not overlap it;
    an empty one (``end <= start``) holds at no instant. ``(0, None, [])`` for none."""
    kept = [(i, s, e) for i, (s, e) in enumerate(intervals) if e > s]
    points = sorted(
        [(e, 0, i) for i, _, e in kept] + [(s, 1, i) for i, s, _ in kept]
    )  # at one instant, ends before starts
    live: set[int] = set()
    best, at, members = 0, None, []
    for t, kind, i in points:
        if kind == 0:
            live.discard(i)
            continue
        live.add(i)
        if len(live) > best:
            best, at, members = len(live), t, sorted(live)
    return best, at, members
