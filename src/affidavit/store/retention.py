"""Retention's tables (migration 25): the policy and its lease (``retention_policy``), the
operator's holds (``retention_holds``), and the tombstones of removed jobs (``archived_jobs``).

:func:`remove_job_txn` is the one statement group that deletes a job from the live store: it
runs inside the caller's transaction, checks again under the job row's lock everything that
made the job removable (finished, sealed with the seal whose pack was verified, no hold, no
child still running, no parent still in the live store), writes the tombstone, and deletes the
job's events, ledger rows, tags, cancel request, limit waits and child link, then the job row.
The seal row stays (a seal in the transparency log cannot be deleted: migration 13), and so do
the queue and limit grants (the proofs of a queue's limits over time). SQL uses ``?``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from affidavit.core.events import utc_now
from affidavit.store._types import TERMINAL_STATUSES, unmatchable

_TERMINAL = ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATUSES))
MAX_VERSION = 2**32 - 1  # (the most events a SQLite job's range holds: see store/sqlite.py)


class Rows(Protocol):
    """What reads need: a transaction, or a snapshot of either backend."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...


class Writes(Rows, Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...


@dataclass(frozen=True, slots=True)
class PolicyRow:
    """The stored policy: ``finished_older_than_s`` ``None`` when none is set; ``archive_dir``
    ``None`` when removed jobs are not archived (``--no-archive``)."""

    finished_older_than_s: int | None
    archive_dir: str | None
    updated_at: str | None
    lease_owner: str | None
    lease_until: float | None
    last_run_at: str | None
    last_archived: int | None


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What the live store keeps of a job retention removed."""

    job_id: str
    namespace: str
    plan_name: str | None
    status: str
    created_at: str
    seal_sha256: str
    pack_path: str | None
    pack_sha256: str | None
    archived_at: str
    # the key it was submitted with: never used again in its namespace (see create_job)
    idempotency_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "namespace": self.namespace,
            "plan_name": self.plan_name,
            "status": self.status,
            "created_at": self.created_at,
            "seal_sha256": self.seal_sha256,
            "pack_path": self.pack_path,
            "pack_sha256": self.pack_sha256,
            "archived_at": self.archived_at,
            "idempotency_key": self.idempotency_key,
        }


_POLICY = (
    "SELECT finished_older_than_s, archive_dir, updated_at, lease_owner, lease_until, "
    "last_run_at, last_archived FROM retention_policy WHERE id = 1"
)
_TOMBSTONE = (
    "SELECT job_id, namespace, plan_name, status, created_at, seal_sha256, pack_path, "
    "pack_sha256, archived_at, idempotency_key FROM archived_jobs"
)


def policy_read(rows: Rows) -> PolicyRow:
    """The policy row (one exists from migration 25 on)."""
    found = rows.query(_POLICY)
    if not found:
        return PolicyRow(None, None, None, None, None, None, None)
    r = found[0]
    return PolicyRow(
        None if r[0] is None else int(r[0]),
        r[1],
        r[2],
        r[3],
        None if r[4] is None else float(r[4]),
        r[5],
        None if r[6] is None else int(r[6]),
    )


def policy_write(tx: Writes, finished_older_than_s: int | None, archive_dir: str | None) -> None:
    """Set (or, with ``None``, clear) the policy."""
    tx.execute(
        "UPDATE retention_policy SET finished_older_than_s = ?, archive_dir = ?, updated_at = ? "
        "WHERE id = 1",
        (finished_older_than_s, archive_dir, utc_now()),
    )


def lease_take(tx: Writes, owner: str, now: float, until: float) -> bool:
    """Take or renew retention's lease for ``owner`` until ``until`` unless another owner holds
    a live one; whether ``owner`` holds it now (as the scheduler's lease: store/schedules.py)."""
    tx.execute(
        "UPDATE retention_policy SET lease_owner = ?, lease_until = ? WHERE id = 1 AND "
        "(lease_owner IS NULL OR lease_owner = ? OR lease_until IS NULL OR lease_until < ?)",
        (owner, until, owner, now),
    )
    found = tx.query("SELECT lease_owner FROM retention_policy WHERE id = 1")
    return bool(found) and found[0][0] == owner


def lease_release(tx: Writes, owner: str, archived: int | None = None) -> None:
    """Give the lease up; with ``archived``, record the run that ends (when, how many)."""
    if archived is not None:
        tx.execute(
            "UPDATE retention_policy SET last_run_at = ?, last_archived = ? "
            "WHERE id = 1 AND lease_owner = ?",
            (utc_now(), archived, owner),
        )
    tx.execute(
        "UPDATE retention_policy SET lease_owner = NULL, lease_until = NULL "
        "WHERE id = 1 AND lease_owner = ?",
        (owner,),
    )


# Why a finished job is kept, each a condition on the job `j` (the same in the selection and in
# the removal's check under the lock). A job is removed with or after its parent, never before
# it (the parent's `verify --tree` reads its children), and a parent not while a child runs.
_KEPT = {
    "held": "EXISTS (SELECT 1 FROM retention_holds h WHERE h.job_id = j.job_id)",
    "child running": (
        "EXISTS (SELECT 1 FROM job_children c JOIN jobs k ON k.job_id = c.child_job_id "
        f"WHERE c.parent_job_id = j.job_id AND k.status NOT IN ({_TERMINAL}))"
    ),
    "parent in the live store": (
        "EXISTS (SELECT 1 FROM job_children c JOIN jobs p ON p.job_id = c.parent_job_id "
        "WHERE c.child_job_id = j.job_id)"
    ),
    "not sealed": "NOT EXISTS (SELECT 1 FROM seals s WHERE s.job_id = j.job_id)",
    "seal not in the log yet": "NOT EXISTS (SELECT 1 FROM tlog_leaves l WHERE l.job_id = j.job_id)",
}
_DUE = f"j.status IN ({_TERMINAL}) AND j.updated_at < ?"


def due_job_ids(rows: Rows, finished_before: str, limit: int) -> list[str]:
    """Up to ``limit`` ids of the jobs that finished before ``finished_before`` (RFC 3339 UTC,
    as the store writes times) and may be removed now, longest finished first."""
    kept = " AND ".join(f"NOT {c}" for c in _KEPT.values())
    found = rows.query(
        f"SELECT j.job_id FROM jobs j WHERE {_DUE} AND {kept} "
        "ORDER BY j.updated_at, j.job_id LIMIT ?",
        (finished_before, limit),
    )
    return [str(r[0]) for r in found]


def kept_counts(rows: Rows, finished_before: str) -> dict[str, int]:
    """Of the jobs finished before ``finished_before``: how many are kept, by the first reason
    that keeps each (``retention show``)."""
    counts: dict[str, int] = {}
    earlier: list[str] = []
    for reason, condition in _KEPT.items():
        before = "".join(f" AND NOT {c}" for c in earlier)
        found = rows.query(
            f"SELECT count(*) FROM jobs j WHERE {_DUE} AND {condition}{before}", (finished_before,)
        )
        counts[reason] = int(found[0][0])
        earlier.append(condition)
    return counts


def why_kept(tx: Rows, job_id: str) -> str | None:
    """Why ``job_id`` may not be removed now (``None``: it may), read inside the removal's
    transaction after its row is locked."""
    found = tx.query("SELECT status FROM jobs j WHERE j.job_id = ?", (job_id,))
    if not found:
        return "no such job in the live store"
    if found[0][0] not in TERMINAL_STATUSES:
        return f"the job is {found[0][0]}"
    for reason, condition in _KEPT.items():
        if tx.query(f"SELECT 1 FROM jobs j WHERE j.job_id = ? AND {condition}", (job_id,)):
            return reason
    return None


def remove_job_txn(tx: Writes, job_id: str, tombstone: Tombstone) -> None:
    """Write ``tombstone`` and delete ``job_id`` from the live store, inside the caller's
    transaction (which checked :func:`why_kept` after locking the job row). SQLite's events
    are found by the job's range of the table's rowid (``EVENTS_BY_JOB_RANGE``)."""
    t = tombstone
    tx.execute(
        "INSERT INTO archived_jobs (job_id, namespace, plan_name, status, created_at, "
        "seal_sha256, pack_path, pack_sha256, archived_at, idempotency_key) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            t.job_id,
            t.namespace,
            t.plan_name,
            t.status,
            t.created_at,
            t.seal_sha256,
            t.pack_path,
            t.pack_sha256,
            t.archived_at,
            t.idempotency_key,
        ),
    )
    if getattr(tx, "EVENTS_BY_JOB_RANGE", False):
        number = tx.query("SELECT number FROM jobs WHERE job_id = ?", (job_id,))[0][0]
        start = int(number) << 32
        # (a row of the job's id outside its range is in no log: left, verify --all reports it)
        tx.execute(
            "DELETE FROM events WHERE seq BETWEEN ? AND ? AND job_id = ?",
            (start + 1, start + MAX_VERSION, job_id),
        )
    else:
        tx.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
    for table, column in (
        ("tool_invocations", "job_id"),
        ("job_tags", "job_id"),
        ("cancel_requests", "job_id"),
        ("limit_waits", "job_id"),
        ("job_children", "child_job_id"),
        ("jobs", "job_id"),
    ):
        tx.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))


def tombstone_of(rows: Rows, job_id: str) -> Tombstone | None:
    """The tombstone of ``job_id``, or ``None`` (also on a copy from before migration 25)."""
    if unmatchable(job_id) or not getattr(rows, "retention_tables", True):
        return None
    found = rows.query(f"{_TOMBSTONE} WHERE job_id = ?", (job_id,))
    return _tombstone(found[0]) if found else None


def tombstones(rows: Rows, *, namespace: str | None, limit: int) -> list[Tombstone]:
    """Up to ``limit`` tombstones, the latest removed first; only ``namespace``'s if given."""
    if not getattr(rows, "retention_tables", True):
        return []
    where, params = ("", ()) if namespace is None else (" WHERE namespace = ?", (namespace,))
    found = rows.query(
        f"{_TOMBSTONE}{where} ORDER BY archived_at DESC, job_id DESC LIMIT ?", (*params, limit)
    )
    return [_tombstone(r) for r in found]


def archived_count(rows: Rows) -> int:
    if not getattr(rows, "retention_tables", True):
        return 0
    return int(rows.query("SELECT count(*) FROM archived_jobs")[0][0])


def _tombstone(r: Sequence[Any]) -> Tombstone:
    return Tombstone(
        str(r[0]), str(r[1]), r[2], str(r[3]), str(r[4]), str(r[5]), r[6], r[7], str(r[8]), r[9]
    )


def archived_key_job(rows: Rows, namespace: str, idempotency_key: str) -> Tombstone | None:
    """The archived job that idempotency key ``idempotency_key`` named in ``namespace``, if
    retention removed it (a key never names a second job: not after its job was archived
    either)."""
    if not getattr(rows, "retention_tables", True):
        return None
    found = rows.query(
        f"{_TOMBSTONE} WHERE namespace = ? AND idempotency_key = ?", (namespace, idempotency_key)
    )
    return _tombstone(found[0]) if found else None


def hold_set(tx: Writes, job_id: str, reason: str) -> None:
    """Hold ``job_id`` (retention never removes it while held); a second hold keeps the first."""
    tx.execute(
        "INSERT INTO retention_holds (job_id, reason, held_at) VALUES (?, ?, ?) "
        "ON CONFLICT (job_id) DO NOTHING",
        (job_id, reason, utc_now()),
    )


def hold_release(tx: Writes, job_id: str) -> bool:
    """Release the hold on ``job_id``; whether there was one."""
    held = bool(tx.query("SELECT 1 FROM retention_holds WHERE job_id = ?", (job_id,)))
    tx.execute("DELETE FROM retention_holds WHERE job_id = ?", (job_id,))
    return held


def holds(rows: Rows) -> list[tuple[str, str, str]]:
    """Every hold: ``(job_id, reason, held_at)``, oldest first."""
    found = rows.query("SELECT job_id, reason, held_at FROM retention_holds ORDER BY held_at")
    return [(str(r[0]), str(r[1]), str(r[2])) for r in found]
