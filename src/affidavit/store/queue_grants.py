"""The recorded grants of a queue with the end of each one's hold on its slot (migration 21).

A grant's hold ends when its job stops being ``running`` under the grant's attempt with a live
lease. The database records that end (``ended_at``, ``ended_as``) in the transaction of the
change that ends it (a trigger on the job's row, whatever statement makes the change). A hold
without a recorded end is either still on its job (the job's row still names the grant's
attempt, ``running`` with an owner): it ends when the lease expires, which the row holds — or
it is one the database never recorded the end of (a grant made before migration 21): then its
end is unknown, and said so (``end`` is ``None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from affidavit.core.errors import MigrationError
from affidavit.store import migrations
from affidavit.store.base import Store, Transaction

# How a hold ended: the job's status that ended it, a lease handed back, or expired; or, for a
# hold without a recorded end, its lease still live ("held") or already expired on the row.
HELD = "held"
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Grant:
    """One claim's grant: its job, attempt, worker, slot, whether it was a start, when it was
    claimed (the worker's clock, the one the limits were counted at), when its hold began by
    the database's clock (``held_from``: read after the claim's lock, the clock of the end; the
    claim time for a grant made before migration 27) and when its hold ended (``None``:
    unknown; still held: ``now``, ``ended_as`` = ``held``), all times in Unix seconds."""

    job_id: str
    attempt_id: str
    owner: str
    slot: int
    started: bool
    claimed_at: float
    end: float | None
    ended_as: str
    held_from: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt_id": self.attempt_id,
            "owner": self.owner,
            "slot": self.slot,
            "started": self.started,
            "claimed_at": self.claimed_at,
            "held_from": self.held_from,
            "ended_at": self.end if self.ended_as != HELD else None,
            "ended_as": self.ended_as,
        }


QUEUES_MIGRATION = 18  # queue_grants
ENDS_MIGRATION = 21  # ended_at, ended_as
HELD_FROM_MIGRATION = 27  # held_from

_COLUMNS = (
    "g.job_id, g.attempt_id, g.owner, g.slot, g.started, g.claimed_at, g.ended_at, g.ended_as, "
    "g.held_from, j.attempt_id, j.status, j.lease_owner, j.lease_expires_at"
)


def _columns(tx: Transaction) -> str:
    """:data:`_COLUMNS` for this database's schema (a store opened read-only may predate the
    migrations of the ends and of ``held_from``: NULL stands for what it does not record)."""
    columns = _COLUMNS
    if not _applied(tx, ENDS_MIGRATION):
        columns = columns.replace("g.ended_at, g.ended_as", "NULL, NULL")
    if not _applied(tx, HELD_FROM_MIGRATION):
        columns = columns.replace("g.held_from", "NULL")
    return columns


def _grant(row: Any, now: float) -> Grant:
    job_id, attempt, owner, slot, started, claimed, ended, ended_as, held_from = row[:9]
    current, status, lease_owner, expires = row[9:]
    end: float | None = None if ended is None else float(ended)
    how = str(ended_as) if ended_as is not None else UNKNOWN
    if end is None and current == attempt and status == "running" and lease_owner is not None:
        if expires is not None and float(expires) < now:
            end, how = float(expires), "lease_expired"
        else:
            end, how = now, HELD
    return Grant(
        str(job_id),
        str(attempt),
        str(owner),
        int(slot),
        bool(started),
        float(claimed),
        end,
        how,
        float(claimed if held_from is None else held_from),
    )


def _applied(tx: Transaction, version: int) -> bool:
    """Whether migration ``version`` is applied (a store opened read-only may read a schema
    before it: see ``migrations.OLDER_SCHEMA_READABLE``)."""
    return bool(tx.query(f"SELECT 1 FROM {migrations.VERSION_TABLE} WHERE version = ?", (version,)))


def queue_grants(store: Store, name: str, since: float, lookback: float, now: float) -> list[Grant]:
    """The grants of queue ``name`` that bear on the time from ``since`` to ``now``: those
    claimed from ``since - lookback`` on (``lookback``: the rate's period, so a window ending
    after ``since`` sees every start in it), and those claimed before whose hold was still on
    at ``since`` (recorded to end after it, or not ended yet). A grant from before ``since``
    whose end was never recorded is not read. Oldest first."""
    with store.transaction(durable=False) as tx:
        if not _applied(tx, ENDS_MIGRATION):
            raise MigrationError(
                "this database does not record when a queue's claims end (its schema predates "
                f"migration {ENDS_MIGRATION}): the concurrency of its queues cannot be proved",
                hint="Run `affidavit db migrate` with write access to the database first.",
            )
        rows = tx.query(
            f"SELECT {_columns(tx)} FROM queue_grants g LEFT JOIN jobs j ON j.job_id = g.job_id "
            "WHERE g.queue = ? AND g.claimed_at <= ? AND (g.claimed_at >= ? OR g.ended_at > ? "
            "OR (g.ended_at IS NULL AND j.attempt_id = g.attempt_id AND j.status = 'running' "
            "AND j.lease_owner IS NOT NULL)) ORDER BY g.claimed_at, g.job_id, g.attempt_id",
            (name, now, since - lookback, since),
        )
    return [_grant(r, now) for r in rows]


def job_queue_claims(store: Store, job_id: str, now: float) -> list[dict[str, Any]]:
    """The claims of job ``job_id`` from its queue, as ``jobs show --json`` lists them, oldest
    first: the queue, the attempt, the worker, the slot, whether it was the job's start, when
    it was claimed and when and how its hold ended. Empty for a job of the default queue."""
    with store.transaction(durable=False) as tx:
        if not _applied(tx, QUEUES_MIGRATION):
            return []
        rows = tx.query(
            f"SELECT g.queue, {_columns(tx)} FROM queue_grants g LEFT JOIN jobs j "
            "ON j.job_id = g.job_id WHERE g.job_id = ? ORDER BY g.claimed_at, g.attempt_id",
            (job_id,),
        )
    return [{"queue": str(r[0])} | _grant(r[1:], now).to_dict() for r in rows]
