"""Consistent reads: one job, its whole log, its ledger rows and its seal as of one moment.

Verification reads a job that may still be running. Reading the job row, the events and the
ledger in separate statements could mix states (a ledger row committed after the events were
read looks like a lie); a snapshot reads them all in one read-only transaction — SQLite's WAL
snapshot, PostgreSQL ``REPEATABLE READ`` — and streams the log in batches so that memory does not
grow with its length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, cast

from affidavit.core.seal import PublicKey, Seal
from affidavit.store._ledger import LEDGER_COLUMNS, _ledger_from_row
from affidavit.store._seals import KEYS_SELECT, SEAL_SELECT, key_from_row, seal_from_row
from affidavit.store._sql import (
    BY_JOB_ID,
)
from affidavit.store._sql_rows import (
    JOBS_ORDER,
    JOBS_SORT,
    job_from_row,
    jobs_where,
)
from affidavit.store._tlog import TlogReads
from affidavit.store.base import (
    JobFilter,
    JobRecord,
    LedgerColumns,
    LedgerRow,
    StoredEvent,
    checked_event,
    unmatchable,
)

DEFAULT_BATCH = 2000
LEDGER_COLUMNS_SELECT = (
    "SELECT idempotency_key, status, invocation_id, coalesce(result, 'null'), node_id, step_id, "
    "tool_name, args_hash FROM tool_invocations WHERE job_id = ? ORDER BY idempotency_key"
)
# see SqlSnapshot.job_row
JOB_ROW_COLUMNS = (
    "status",
    "output",
    "error",
    "namespace",
    "plan_name",
    "submitted_by",
    "idempotency_key",
)
# Records of jobs that have no job row (see SqlSnapshot.iter_orphans): one anti-join per table
# that names a job, each id once per table; `{only}` narrows them to one job id.
_NO_JOB_ROW = "NOT EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = {t}.job_id){only}"
ORPHAN_TABLES = (("events", "events"), ("tool_invocations", "ledger rows"), ("seals", "seal"))
# A job retention removed keeps its seal (a logged seal cannot be deleted) and has a tombstone:
# its seal is no orphan. Its events or ledger rows would still be (the removal deletes them in
# the transaction that writes the tombstone).
_NOT_ARCHIVED = " AND NOT EXISTS (SELECT 1 FROM archived_jobs a WHERE a.job_id = t.job_id)"


class SqlSnapshot(TlogReads, ABC):
    """The :class:`~affidavit.store.base.Snapshot` reads over two backend primitives."""

    # (the whole log is read without recorded_at: informational, not covered by the chain, and
    # costly to convert per row)
    log_sql = BY_JOB_ID
    seal_select = SEAL_SELECT  # (LEGACY_SEAL_SELECT on a copy made before migration 12)
    retention_tables = True  # (False on a copy made before migration 25: none archived)

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """All rows of one statement."""

    @abstractmethod
    def stream(self, sql: str, params: Sequence[Any], batch: int) -> Iterator[Sequence[Any]]:
        """The rows of one statement, fetched ``batch`` at a time."""

    def stream_in_key_order(
        self, sql: str, params: Sequence[Any], batch: int
    ) -> Iterator[Sequence[Any]]:
        """:meth:`stream` for a job's log or ledger, ordered as its primary key: where a
        backend's planner would sort such rows, it is told to walk the key instead."""
        return self.stream(sql, params, batch)

    def plan_freely(self) -> None:
        """Before a listing of jobs: undo what :meth:`stream_in_key_order` told the planner."""

    def get_job(self, job_id: str) -> JobRecord | None:
        if unmatchable(job_id):  # no job can have it
            return None
        rows = self.query(f"{self.log_sql.job_select} WHERE j.job_id = ?", (job_id,))
        return job_from_row(rows[0]) if rows else None

    def job_row(self, job_id: str) -> dict[str, Any] | None:
        """The columns of the job row that its log records too (see :data:`JOB_ROW_COLUMNS`),
        by name, as stored — the output and error as their JSON text, not parsed (a row edited
        outside the store may hold anything there) — or ``None`` for no such job."""
        rows = self.query(
            f"SELECT {', '.join(JOB_ROW_COLUMNS)} FROM jobs WHERE job_id = ?", (job_id,)
        )
        return dict(zip(JOB_ROW_COLUMNS, rows[0], strict=True)) if rows else None

    def list_job_ids(self, filters: JobFilter) -> list[str]:
        """The ids of the jobs :meth:`~affidavit.store.base.Store.list_jobs` lists for
        ``filters``, in its order — reading no other column, so that a job row edited outside
        the store (text that is not UTF-8, say) is still listed, to be verified."""
        where, params = jobs_where(filters)
        self.plan_freely()
        rows = self.query(f"SELECT j.job_id FROM jobs j{where} {JOBS_ORDER}", params)
        return [row[0] for row in rows]

    def iter_job_ids(self, filters: JobFilter, *, batch: int = DEFAULT_BATCH) -> Iterator[str]:
        """The ids of every job ``filters`` select (their limit and offset ignored), in the
        order of :meth:`list_job_ids`, streamed by one query: paging with an offset would
        make each page skip all the ones before it again (quadratic in the number of jobs)."""
        where, params = jobs_where(filters)  # (checks the filters)
        self.plan_freely()
        rows = self.stream(f"SELECT j.job_id FROM jobs j{where} {JOBS_SORT}", params[:-2], batch)
        return (row[0] for row in rows)

    def iter_orphans(
        self, job_id: str | None = None, *, batch: int = DEFAULT_BATCH
    ) -> Iterator[tuple[str, str]]:
        """``(job_id, what)`` for every job id that names events (``what`` is ``events``),
        ledger rows (``ledger rows``) or a seal (``seal``) but has no job row — records left
        behind when a job row was deleted outside the store (the seal of a job retention
        archived is not one) — ordered by job id, each pair once; only ``job_id``'s when
        given. One anti-join per table, streamed."""
        if job_id is not None and unmatchable(job_id):
            return iter(())
        only = " AND t.job_id = ?" if job_id is not None else ""
        parts = []
        for table, what in ORPHAN_TABLES:
            where = _NO_JOB_ROW.format(t="t", only=only)
            if table == "seals" and self.retention_tables:
                where += _NOT_ARCHIVED
            parts.append(f"SELECT DISTINCT t.job_id, '{what}' FROM {table} t WHERE {where}")
        sql = " UNION ALL ".join(parts) + " ORDER BY 1, 2"
        params = (job_id,) * len(parts) if job_id is not None else ()
        self.plan_freely()
        return cast("Iterator[tuple[str, str]]", self.stream(sql, params, batch))

    def iter_orphan_event_rows(
        self, job_id: str | None = None, *, batch: int = DEFAULT_BATCH
    ) -> Iterator[tuple[str, int, str, str, bytes, str]]:
        """``(job_id, version, event_id, type, payload bytes, chain_hash)`` of every event
        whose job has no job row (only ``job_id``'s when given), ordered by job id (as
        :meth:`iter_orphans`), each log in the order a job's log is read. Without the job row,
        SQLite cannot find a log by its range: this reads the whole events table once."""
        if job_id is not None and unmatchable(job_id):
            return iter(())
        only = " AND e.job_id = ?" if job_id is not None else ""
        sql = (
            "SELECT e.job_id, e.version, e.event_id, e.type, e.payload, e.chain_hash "
            f"FROM events e WHERE {_NO_JOB_ROW.format(t='e', only=only)} "
            f"ORDER BY e.job_id, e.{self.log_sql.position}"
        )
        params = (job_id,) if job_id is not None else ()
        return cast(
            "Iterator[tuple[str, int, str, str, bytes, str]]",
            self.stream_in_key_order(sql, params, batch),
        )

    def iter_misplaced_events(
        self, *, batch: int = DEFAULT_BATCH
    ) -> Iterator[tuple[str, int, int, str | None]]:
        """``(job_id, version, position, holder)`` of every event row of a job that has a job
        row but that no read of the job's log returns: on SQLite a row whose ``seq`` is not in
        its job's range (``holder``: the job whose range it is in, ``None`` for none), put
        there by hand. Ordered by job id and position; empty on PostgreSQL, whose logs are
        read by ``(job_id, version)``. One pass over the events table."""
        sql = self.log_sql.misplaced
        if sql is None:
            return iter(())
        self.plan_freely()
        return cast("Iterator[tuple[str, int, int, str | None]]", self.stream(sql, (), batch))

    def iter_events(self, job_id: str, *, batch: int = DEFAULT_BATCH) -> Iterator[StoredEvent]:
        for row in self.stream_in_key_order(self.log_sql.events, (job_id,), batch):
            yield checked_event(row)

    def iter_event_rows(
        self, job_id: str, *, batch: int = DEFAULT_BATCH
    ) -> Iterator[tuple[int, str, str, bytes, str]]:
        """``(version, event_id, type, payload bytes, chain_hash)`` in version order: the
        fields a verifier needs, without building an object per event."""
        rows = self.stream_in_key_order(self.log_sql.rows, (job_id,), batch)  # those tuples
        return cast("Iterator[tuple[int, str, str, bytes, str]]", rows)

    def iter_ledger_columns(
        self, job_id: str, *, batch: int = DEFAULT_BATCH
    ) -> Iterator[LedgerColumns]:
        """``(idempotency_key, status, invocation_id, result, node_id, step_id, tool_name,
        args_hash)`` per ledger row in key order, ``result`` the stored text (``null`` when
        there is none): every column the log has a counterpart of, as read (a row edited
        outside the store may hold another type than text), without an object per row."""
        rows = self.stream_in_key_order(LEDGER_COLUMNS_SELECT, (job_id,), batch)  # those tuples
        return cast("Iterator[LedgerColumns]", rows)

    def ledger_list(self, job_id: str) -> list[LedgerRow]:
        return list(self.iter_ledger(job_id))

    def iter_ledger(self, job_id: str, *, batch: int = DEFAULT_BATCH) -> Iterator[LedgerRow]:
        sql = (
            f"SELECT {LEDGER_COLUMNS} FROM tool_invocations WHERE job_id = ? "
            "ORDER BY idempotency_key"
        )
        for row in self.stream_in_key_order(sql, (job_id,), batch):
            yield _ledger_from_row(row)

    def seal_get(self, job_id: str) -> Seal | None:
        rows = self.query(self.seal_select, (job_id,))
        return seal_from_row(rows[0]) if rows else None

    def keys_list(self) -> list[PublicKey]:
        return [key_from_row(r) for r in self.query(KEYS_SELECT)]
