"""Tool and model limits across workers (tables ``limit_state`` and ``limit_grants``,
migration 19): the grants a limited call takes before its T1.

One take, in one transaction of its own:

(1) lock the limit's state row (an upsert: PostgreSQL locks the row, SQLite's ``BEGIN
    IMMEDIATE`` already serializes writers), so concurrent takers of one limit take turns and
    each reads what the one before it committed;
(2) in flight: grants not released whose claim still holds its job's lease (a dead worker's
    grants end with its lease, a reclaimed job's with its old claim) — fewer than
    ``concurrency``, or wait;
(3) the grant's time: this host's clock read after (2), never before the limit's last grant.
    After (2): a release that (2) saw committed before it, and the finish its call recorded was
    timed before that commit, so the grant is never timed before the end of the call it
    replaced (read before (2), on PostgreSQL a release committing in between would let the
    grant be timed before that call's recorded end). Never before the last grant: recorded
    grant times of one limit never go backwards and a window counted from them is exact;
(4) rate: grants with a time in the last period — fewer than ``count``, or wait until the
    oldest of them leaves the window;
(5) insert the grant (fenced: only while the claim holds the job), and forget grants that no
    window or instant can count any more.

Mixed into :class:`~affidavit.store._sql.SqlTransaction`. SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.core.events import utc_now

# A grant is in flight while this holds (g: limit_grants, j: jobs; ? = now in seconds).
_LIVE = (
    "g.released_us IS NULL AND j.status = 'running' AND j.attempt_id = g.attempt_id "
    "AND j.lease_expires_at > ?"
)
_LOCK = (
    "INSERT INTO limit_state (name, last_granted_us, rate_count, period_us, concurrency, "
    "updated_at) VALUES (?, 0, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
    "rate_count = excluded.rate_count, period_us = excluded.period_us, "
    "concurrency = excluded.concurrency, updated_at = excluded.updated_at "
    "RETURNING last_granted_us"
)
_IN_FLIGHT = (
    "SELECT count(*) FROM limit_grants g JOIN jobs j ON j.job_id = g.job_id "
    f"WHERE g.name = ? AND {_LIVE}"
)
_WINDOW = (
    "SELECT granted_us FROM limit_grants WHERE name = ? AND granted_us > ? "
    "ORDER BY granted_us DESC LIMIT ?"
)
_FENCE = "SELECT 1 FROM jobs WHERE job_id = ? AND status = 'running' AND attempt_id = ?"
_INSERT = (
    "INSERT INTO limit_grants (grant_id, name, job_id, attempt_id, granted_us) "
    "VALUES (?, ?, ?, ?, ?)"
)
# Released, or dead (its claim gone), and out of every window: nothing counts it any more.
_FORGET = (
    "DELETE FROM limit_grants WHERE name = ? AND granted_us <= ? AND (released_us IS NOT NULL "
    "OR NOT EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = limit_grants.job_id "
    "AND j.status = 'running' AND j.attempt_id = limit_grants.attempt_id "
    "AND j.lease_expires_at > ?))"
)
_RELEASE = "UPDATE limit_grants SET released_us = ? WHERE grant_id = ? AND released_us IS NULL"
_USAGE = (
    "SELECT s.name, s.rate_count, s.period_us, s.concurrency, s.last_granted_us, "
    "(SELECT count(*) FROM limit_grants g JOIN jobs j ON j.job_id = g.job_id "
    f"WHERE g.name = s.name AND {_LIVE}), "
    "(SELECT count(*) FROM limit_grants w WHERE w.name = s.name "
    "AND w.granted_us > ? - coalesce(s.period_us, 0)) "
    "FROM limit_state s ORDER BY s.name"
)


@dataclass(frozen=True, slots=True)
class GrantTaken:
    """A take's answer: ``granted_us`` when granted, else how long to wait before trying again
    (``wait_seconds``; ``None`` when only a release can free a slot) and why."""

    granted_us: int | None
    wait_seconds: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LimitUsage:
    """One limit's use now (``affidavit limits list``)."""

    name: str
    rate_count: int | None
    period_seconds: float | None
    concurrency: int | None
    in_flight: int
    in_window: int
    last_grant_us: int


class LimitOps:
    """The limit statements of a transaction."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def limit_take(
        self,
        name: str,
        *,
        grant_id: str,
        job_id: str,
        attempt_id: str,
        clock: Callable[[], int],
        rate: tuple[int, int] | None,
        concurrency: int | None,
    ) -> GrantTaken:
        """Take a grant of limit ``name`` for the claim ``attempt_id`` of ``job_id`` now
        (``clock``: this host's clock in µs, read once the limit is locked), if ``rate``
        (count, period in µs) and ``concurrency`` allow it now; see the module docstring.
        Nothing is written when the answer is to wait, or when the claim no longer holds the
        job (``reason`` "fenced")."""
        count, period_us = rate if rate is not None else (None, None)
        # (1)
        (last_us,) = self.query(_LOCK, (name, count, period_us, concurrency, utc_now()))[0]
        # (2)
        if concurrency is not None:
            (live,) = self.query(_IN_FLIGHT, (name, max(clock(), int(last_us)) / 1e6))[0]
            if int(live) >= concurrency:
                return GrantTaken(None, None, f"{live} of {concurrency} in flight")
        # (3)
        at = max(clock(), int(last_us))
        now_s = at / 1e6
        # (4)
        if count is not None and period_us is not None:
            window = self.query(_WINDOW, (name, at - period_us, count))
            if len(window) >= count:
                oldest = int(window[-1][0])  # the count-th newest: the first to leave
                wait = (oldest + period_us - at) / 1e6
                return GrantTaken(None, max(wait, 1e-6), f"{count} started in {period_us / 1e6:g}s")
        # (5)
        if not self.query(_FENCE, (job_id, attempt_id)):
            return GrantTaken(None, None, "fenced")
        self.execute(_INSERT, (grant_id, name, job_id, attempt_id, at))
        self.execute("UPDATE limit_state SET last_granted_us = ? WHERE name = ?", (at, name))
        horizon = at - (period_us or 0)
        self.execute(_FORGET, (name, horizon, now_s))
        return GrantTaken(at)

    def limit_release(self, grant_id: str, *, at_us: int) -> None:
        """End grant ``grant_id`` (in flight no more); a released grant stays released."""
        self.execute(_RELEASE, (at_us, grant_id))

    def limit_usage(self, *, now_us: int) -> list[LimitUsage]:
        """Every limit a call has taken a grant of, with its use at ``now_us``."""
        rows = self.query(_USAGE, (now_us / 1e6, now_us))
        return [
            LimitUsage(
                str(r[0]),
                None if r[1] is None else int(r[1]),
                None if r[2] is None else int(r[2]) / 1e6,
                None if r[3] is None else int(r[3]),
                int(r[5]),
                int(r[6]) if r[2] is not None else 0,
                int(r[4]),
            )
            for r in rows
        ]
