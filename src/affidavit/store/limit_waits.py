"""Around the grants of tool limits (store/_limits.py): the calls waiting for one now (table
``limit_waits``, migration 22), and the declarations workers start with.

A waiting call records nothing in its job's log (the log carries each grant once taken, with
its call). What it waits for is shown from a row here instead: written in a transaction of its
own when the call starts waiting, deleted in the transaction that takes its grant (or when its
run stops waiting). A row counts only while the claim that wrote it holds its job's lease, as a
grant does: a worker that dies waiting leaves a row nobody shows, deleted with the job's next
grant of any limit.

A limit's declaration (its rate and concurrency) lives in the code of each worker. Workers
declaring one limit name differently would each enforce their own; so a worker declares its
limits when it starts (:func:`declare_limit`) and is refused when another declaration of the
name is in use — a grant in flight, or one taken in the last minute (or the rate's period, when
longer). A limit nobody used for that long takes the new declaration: a redeploy that changes
it.

SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from affidavit.core.events import utc_now
from affidavit.store.base import Store, Transaction

_REASON_MAX = 200  # a reason is the store's own text; bounded anyway

_LIVE_WAIT = (
    "SELECT w.name, w.since, w.reason FROM limit_waits w JOIN jobs j ON j.job_id = w.job_id "
    "WHERE w.job_id = ? AND j.status = 'running' AND j.attempt_id = w.attempt_id "
    "AND j.lease_expires_at > ? ORDER BY w.since, w.grant_id LIMIT 1"
)
_IN_FLIGHT = (
    "SELECT count(*) FROM limit_grants g JOIN jobs j ON j.job_id = g.job_id "
    "WHERE g.name = ? AND g.released_us IS NULL AND j.status = 'running' "
    "AND j.attempt_id = g.attempt_id AND j.lease_expires_at > ?"
)
_DECLARE = (
    "INSERT INTO limit_state (name, last_granted_us, rate_count, period_us, concurrency, "
    "updated_at) VALUES (?, 0, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
    "rate_count = excluded.rate_count, period_us = excluded.period_us, "
    "concurrency = excluded.concurrency, updated_at = excluded.updated_at"
)
# A declaration is in use while a grant of it is in flight or was taken this recently (µs).
IN_USE_US = 60_000_000


def wait_begin(
    tx: Transaction, *, grant_id: str, name: str, job_id: str, attempt_id: str, since: str,
    reason: str,
) -> None:  # fmt: skip
    """Show that the call that will take grant ``grant_id`` waits for limit ``name``."""
    tx.execute(
        "INSERT INTO limit_waits (grant_id, name, job_id, attempt_id, since, reason) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (grant_id, name, job_id, attempt_id, since, reason[:_REASON_MAX]),
    )


def wait_end(tx: Transaction, *, grant_id: str, job_id: str, attempt_id: str) -> None:
    """The call waits no more (granted, or its run stopped): delete its row, and those of the
    job's earlier claims (a worker that died waiting)."""
    tx.execute(
        "DELETE FROM limit_waits WHERE job_id = ? AND (grant_id = ? OR attempt_id <> ?)",
        (job_id, grant_id, attempt_id),
    )


def waiting_for_limit(store: Store, job_id: str, *, now_s: float) -> dict[str, Any] | None:
    """``{"limit", "since", "reason"}``: the limit the job's oldest waiting call waits for at
    ``now_s`` (Unix seconds), or ``None`` when none of its calls waits."""
    with store.transaction(durable=False) as tx:
        rows = tx.query(_LIVE_WAIT, (job_id, now_s))
    if not rows:
        return None
    name, since, reason = rows[0]
    return {"limit": str(name), "since": str(since), "reason": str(reason)}


@dataclass(frozen=True, slots=True)
class Declared:
    """A limit's declaration: its rate (count, period in µs) and concurrency."""

    rate: tuple[int, int] | None
    concurrency: int | None

    def describe(self) -> str:
        parts = []
        if self.rate is not None:
            parts.append(f"rate {self.rate[0]} per {self.rate[1] / 1e6:g}s")
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        return ", ".join(parts) or "no bound"


def declare_limit(tx: Transaction, name: str, mine: Declared, *, now_us: int) -> Declared | None:
    """Declare limit ``name`` as ``mine``; return the other declaration in use, if one is (and
    change nothing), else ``None`` (the store keeps ``mine``)."""
    rows = tx.query(
        "SELECT rate_count, period_us, concurrency, last_granted_us FROM limit_state "
        "WHERE name = ?",
        (name,),
    )
    if rows:
        count, period, concurrency, last_us = rows[0]
        theirs = Declared(
            None if count is None or period is None else (int(count), int(period)),
            None if concurrency is None else int(concurrency),
        )
        if theirs != mine:
            recent = int(last_us) > now_us - max(IN_USE_US, theirs.rate[1] if theirs.rate else 0)
            (live,) = tx.query(_IN_FLIGHT, (name, now_us / 1e6))[0]
            if recent or int(live) > 0:
                return theirs
    count_, period_ = mine.rate if mine.rate is not None else (None, None)
    tx.execute(_DECLARE, (name, count_, period_, mine.concurrency, utc_now()))
    return None
