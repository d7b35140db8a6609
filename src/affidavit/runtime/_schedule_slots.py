"""A schedule's slots: the instants (whole Unix seconds) its jobs are due at, and which of them
a scheduler fires after it was away (catch-up).

``--every P`` has a slot at every multiple of P seconds since the Unix epoch, so every worker,
on any host, computes the same slots. ``--cron EXPR`` is read by the croniter library in the
schedule's time zone (IANA name, default UTC): five fields, minute hour day-of-month month
day-of-week. Around a daylight-saving change a wall-clock time that does not exist fires at the
first instant after it; one that happens twice fires once (the first), unless the hour field is
``*`` (an hourly schedule then fires for each real hour), as cron does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from affidavit.core.errors import ConfigError

#: The most slots ``--catch-up all`` fires after one absence; earlier missed slots are skipped
#: (with a warning) and counted as skipped.
MAX_CATCH_UP = 100
#: How many missed slots of a cron schedule are counted as skipped, at most, per absence.
MAX_COUNTED = 1000
#: The longest cron expression accepted.
MAX_CRON_LENGTH = 200
#: The shortest and longest ``--every`` period, in seconds.
MIN_EVERY, MAX_EVERY = 1, 366 * 86400
#: How late a slot may be fired with ``--catch-up none`` (at most its period).
ON_TIME_SECONDS = 60
CATCH_UP_MODES = ("none", "latest", "all")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"([1-9][0-9]{0,8})(s|m|h|d)\Z")


def parse_every(text: str) -> int:
    """``30s``, ``5m``, ``2h``, ``1d`` as whole seconds.

    Raises:
        ConfigError: anything else, or a period outside 1 s to 366 days.
    """
    found = _EVERY.match(text.strip()) if isinstance(text, str) else None
    seconds = int(found.group(1)) * _UNITS[found.group(2)] if found else 0
    if not MIN_EVERY <= seconds <= MAX_EVERY:
        raise ConfigError(
            f"--every {text!r} is not a period of 1 s to 366 days",
            hint="A whole number and a unit: 30s, 5m, 2h or 1d.",
        )
    return seconds


def check_timezone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``.

    Raises:
        ConfigError: no such time zone.
    """
    try:
        if not isinstance(name, str) or not name or len(name) > 100 or ".." in name:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"unknown time zone {name!r}",
            hint="An IANA time zone name, e.g. UTC, Europe/Berlin or America/New_York.",
        ) from None


def check_cron(expr: str) -> str:
    """``expr`` if it is a five-field cron expression croniter reads.

    Raises:
        ConfigError: naming what is wrong, with a hint.
    """
    from croniter import croniter

    hint = (
        'Five fields: minute hour day-of-month month day-of-week, e.g. "0 2 * * *" '
        '(02:00 every day) or "*/15 * * * 1-5".'
    )
    if not isinstance(expr, str) or len(expr) > MAX_CRON_LENGTH:
        raise ConfigError("the cron expression is too long", hint=hint)
    fields = expr.split()
    if len(fields) != 5:
        raise ConfigError(f"cron expression {expr!r} has {len(fields)} fields, not 5", hint=hint)
    joined = " ".join(fields)
    if not croniter.is_valid(joined):
        raise ConfigError(f"invalid cron expression {expr!r}", hint=hint)
    try:
        croniter(joined, datetime.now(UTC)).get_next(float)
    except ValueError:  # (croniter's CroniterBadDateError: no such date in years)
        raise ConfigError(
            f"cron expression {expr!r} never fires (no such date)", hint=hint
        ) from None
    return joined


def iso_slot(slot: int) -> str:
    """A slot as ISO 8601 UTC, e.g. ``2026-12-02T02:00:00Z`` (the idempotency key's form)."""
    return datetime.fromtimestamp(slot, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Slots:
    """The slots of one schedule: ``every`` seconds, or ``cron`` in ``timezone``."""

    cron: str | None
    every: int | None
    timezone: str = "UTC"

    def _cron(self, start: int) -> object:
        from croniter import croniter

        return croniter(self.cron, datetime.fromtimestamp(start, ZoneInfo(self.timezone)))

    def _repeat(self, slot: int) -> bool:
        """Whether ``slot`` is the second occurrence of a wall-clock time (a daylight-saving
        change back) of a schedule whose hour field is not ``*``: not a slot."""
        assert self.cron is not None
        if self.cron.split()[1] == "*":
            return False
        local = datetime.fromtimestamp(slot, ZoneInfo(self.timezone))
        return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()

    def next_after(self, t: int) -> int:
        """The first slot after ``t``."""
        if self.every is not None:
            return (t // self.every + 1) * self.every
        it = self._cron(t)
        while True:
            slot = int(it.get_next(float))  # type: ignore[attr-defined]
            if not self._repeat(slot):
                return slot

    def latest(self, after: int, upto: int, limit: int) -> list[int]:
        """The latest slots in ``(after, upto]``, at most ``limit``, oldest first."""
        if limit < 1 or upto <= after:
            return []
        if self.every is not None:
            last = upto // self.every * self.every
            first = max(after // self.every + 1, last // self.every - limit + 1) * self.every
            return list(range(first, last + 1, self.every))
        found: list[int] = []
        it = self._cron(upto + 1)
        while len(found) < limit:
            slot = int(it.get_prev(float))  # type: ignore[attr-defined]
            if slot <= after:
                break
            if not self._repeat(slot):
                found.append(slot)
        return found[::-1]

    def count(self, after: int, before: int) -> int:
        """How many slots lie in ``(after, before)`` (for cron: at most :data:`MAX_COUNTED`)."""
        if before <= after + 1:
            return 0
        if self.every is not None:
            return max(0, math.ceil(before / self.every) - (after // self.every + 1))
        n, t = 0, after
        while n < MAX_COUNTED:
            t = self.next_after(t)
            if t >= before:
                break
            n += 1
        return n

    def period_at(self, slot: int) -> int:
        """The time from ``slot`` to the next slot."""
        return self.next_after(slot) - slot


@dataclass(frozen=True, slots=True)
class Due:
    """What a scheduler does with a schedule now: fire ``fire`` (oldest first), and count
    ``skipped`` slots as decided without a job; ``through`` is the latest slot decided."""

    fire: tuple[int, ...]
    skipped: int
    through: int | None


def due(slots: Slots, after: int, now: float, catch_up: str) -> Due:
    """The slots in ``(after, now]`` to fire under ``catch_up``: ``all`` fires each (the latest
    :data:`MAX_CATCH_UP` of them), ``latest`` the latest one, ``none`` the latest one only if
    it is on time (at most :data:`ON_TIME_SECONDS`, and at most its period, late)."""
    upto = math.floor(now)
    limit = MAX_CATCH_UP if catch_up == "all" else 1
    fire = slots.latest(after, upto, limit)
    if not fire:
        return Due((), 0, None)
    through = fire[-1]
    skipped = slots.count(after, fire[0])
    if catch_up == "none" and now - through > min(ON_TIME_SECONDS, slots.period_at(through)):
        return Due((), skipped + 1, through)
    return Due(tuple(fire), skipped, through)
