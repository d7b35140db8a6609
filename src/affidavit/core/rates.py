"""The rate syntax of queues and limits: ``N/PERIOD`` (``100/60s``, ``5/1s``, ``10/1m``).

One parser for every place a rate is written (a queue's ``rate``, a tool's ``Limit``), so that
the CLI, the decorators and the store agree on what a rate means: at most ``count`` starts in
any sliding window of ``period_seconds``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RATE = re.compile(r"^\s*(\d{1,9})\s*/\s*(\d{1,9}(?:\.\d{1,6})?)\s*(ms|s|m|h|d)?\s*\Z")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_HINT = "Write a rate as N/PERIOD: 100/60s, 5/1s, 10/1m, 1000/1h (units ms, s, m, h, d)."


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` starts in any window of ``period_seconds``."""

    count: int
    period_seconds: float

    def __str__(self) -> str:
        return f"{self.count}/{self.period_seconds:g}s"


def parse_rate(text: str) -> Rate:
    """Parse ``N/PERIOD``. The unit defaults to seconds; both numbers must be positive.

    Raises:
        ValueError: not a rate (the message says why and shows the syntax).
    """
    if not isinstance(text, str):
        raise ValueError(f"a rate must be text like '100/60s', not {text!r}. {_HINT}")
    match = _RATE.match(text)
    if match is None:
        raise ValueError(f"{text[:40]!r} is not a rate. {_HINT}")
    count, amount, unit = int(match[1]), float(match[2]), match[3] or "s"
    period = amount * _UNIT_SECONDS[unit]
    if count < 1 or period <= 0:
        raise ValueError(f"{text!r}: the count and the period must be positive. {_HINT}")
    return Rate(count, period)
