"""SQL shared by both backends: the transaction logic of append, jobs and leases.

Backends differ in connection handling, locking and durability (their own modules), in how
they keep a job's log (the reads of :class:`LogSql`: PostgreSQL by its ``(job_id, version)``
key, SQLite as a range of the rowid) and in the placeholder style: every SQL string here is
written with ``?`` placeholders, which the PostgreSQL backend converts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS
from affidavit.core.errors import (
    FencedError,
    IdempotencyConflict,
    JobNotFound,
    StoreError,
)
from affidavit.core.events import utc_now
from affidavit.core.ids import new_job_id
from affidavit.store._apikeys import ApiKeyWrites
from affidavit.store._cancels import CancelOps
from affidavit.store._children import ChildOps
from affidavit.store._claims import ClaimOps
from affidavit.store._ledger import LedgerOps
from affidavit.store._limits import LimitOps
from affidavit.store._sealkeys import SealKeyOps
from affidavit.store._seals import (
    SealOps,
)
from affidavit.store._sql_rows import (
    _check_status,
    chain_events,
    check_head,
    head_moved,
    job_from_row,
    pre_encoded,
)
from affidavit.store._subjects import SubjectOps
from affidavit.store._tlog import TlogWrites
from affidavit.store._trust import TrustOps
from affidavit.store._types import TERMINAL_STATUSES
from affidavit.store.base import (
    Encoded,
    JobRecord,
    NewEvent,
    NextClaim,
    StoredEvent,
    checked_event,
)

if TYPE_CHECKING:
    pass

JOB_COLUMNS = (
    "job_id, namespace, status, plan_name, idempotency_key, submitted_by, created_at, "
    "updated_at, attempt_id, lease_owner, lease_expires_at, output, error"
)
EVENT_COLUMNS = "job_id, version, event_id, type, payload, chain_hash, recorded_at"


@dataclass(frozen=True, slots=True)
class LogSql:
    """The reads that find a job's log. The backends keep it differently: PostgreSQL by the
    ``(job_id, version)`` primary key, SQLite as one range of the events table's rowid
    (``seq``; see :mod:`affidavit.store.sqlite`). Placeholders are ``?``, or ``?1``/``?2`` in
    SQLite's statements, which name one parameter twice."""

    job_select: str  # a job row with its chain head (JobRecord columns), to be followed by WHERE
    after: str  # EVENT_COLUMNS after a version, in version order; (job_id, after_version)
    rows: str  # (version, event_id, type, payload, chain_hash) of the whole log; (job_id,)
    events: str  # (job_id, version, event_id, type, payload, chain_hash) likewise; (job_id,)
    hashes: str  # (chain_hash,) of the whole log in order; (job_id,)
    position: str = "version"  # the events column a log is read in order of
    # (job_id, version, position, the job whose log the position is in or NULL) of every event
    # row of a job (with a job row) that lies outside that job's log as `events` reads it, by
    # job id and position; None where a job's rows are its log by construction
    misplaced: str | None = None


def job_row_select(output: str = "j.output", error: str = "j.error") -> str:
    """The start of :attr:`LogSql.job_select`: a job's columns, reading its output and error
    as the expressions given, then its chain head (to be joined ``ON`` its last event)."""
    return (
        "SELECT j.job_id, j.namespace, j.status, j.plan_name, j.idempotency_key, "
        "j.submitted_by, j.created_at, j.updated_at, j.attempt_id, j.lease_owner, "
        f"j.lease_expires_at, {output}, {error}, coalesce(e.version, 0), e.chain_hash "
        "FROM jobs j LEFT JOIN events e "
    )


JOB_ROW = job_row_select()
# A job row with its chain head: the job's last event, found in O(log n) through the
# (job_id, version) key — the head is never stored twice, so an append writes only event rows.
BY_JOB_ID = LogSql(
    job_select=JOB_ROW + "ON e.job_id = j.job_id AND e.version = "
    "(SELECT max(version) FROM events WHERE job_id = j.job_id)",
    after=f"SELECT {EVENT_COLUMNS} FROM events WHERE job_id = ? AND version > ? ORDER BY version",
    rows="SELECT version, event_id, type, payload, chain_hash FROM events "
    "WHERE job_id = ? ORDER BY version",
    events="SELECT job_id, version, event_id, type, payload, chain_hash FROM events "
    "WHERE job_id = ? ORDER BY version",
    hashes="SELECT chain_hash FROM events WHERE job_id = ? ORDER BY version",
)
EVENT_INSERT = (
    "INSERT INTO events (job_id, version, event_id, type, payload, chain_hash) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
LOCK_JOB = "SELECT attempt_id FROM jobs WHERE job_id = ? FOR UPDATE"  # PostgreSQL
HEAD_SELECT = (
    "SELECT version, chain_hash FROM events WHERE job_id = ? ORDER BY version DESC LIMIT 1"
)


class Cursor(Protocol):
    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...
    def executemany(self, sql: Any, params: Any, /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


_INSERT_JOB = (
    f"INSERT INTO jobs ({JOB_COLUMNS}) "
    "SELECT ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, NULL, NULL "
    "WHERE NOT EXISTS (SELECT 1 FROM archived_jobs a "
    "WHERE a.namespace = ? AND a.idempotency_key = ?) "
    "ON CONFLICT DO NOTHING RETURNING job_id"
)


class SqlTransaction(
    LedgerOps,
    CancelOps,
    ChildOps,
    LimitOps,
    SealOps,
    SealKeyOps,
    ApiKeyWrites,
    TlogWrites,
    TrustOps,
    ClaimOps,
    SubjectOps,
    ABC,
):
    """The :class:`~affidavit.store.base.Transaction` logic, over four primitives that each
    backend implements on a connection already inside a transaction. SQL is written with ``?``
    placeholders."""

    FOR_UPDATE = ""
    log_sql = BY_JOB_ID

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement that returns no rows.

        For the store's own layers (migrations, the ledger); not a public query API. A backend
        may defer sending it until the next read or the commit (PostgreSQL batches writes into
        the next round trip), so its errors can surface there — still inside this transaction.
        """

    @abstractmethod
    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """:meth:`execute` once per parameter row."""

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one row-returning statement (after any deferred writes) and return its rows."""

    def commit_with_next_read(self) -> None:
        """Let the next read carry the commit, for a transaction whose last statement is a
        read: nothing may follow it. A backend whose commit is a round trip of its own sends
        both together (PostgreSQL); by default the commit stays where it is."""

    def claim_after_commit(self, request: NextClaim) -> None:
        """See :meth:`Transaction.claim_after_commit`: by default nothing is done (the claimer
        claims the usual way); a backend whose commit is a round trip of its own sends the
        claim with it (PostgreSQL)."""

    @abstractmethod
    def _lock_and_head(self, job_id: str) -> tuple[Any, Any]:
        """Lock the job against other appenders, then read its head; return
        ``((attempt_id,) | None, (version, chain_hash) | None)``. The head must be read after the
        lock is held, so that it includes whatever the previous holder committed."""

    def _append_after_head(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        expected_version: int,
        fence: str | None,
        head: bytes,
    ) -> list[StoredEvent]:
        """Append when the caller already knows the head (``H_expected_version``). By default
        the head is read anyway and must agree; a backend where that read is a statement of
        its own may skip it (see :class:`~affidavit.store.sqlite.SqliteTransaction`)."""
        job_row, head_row = self._lock_and_head(job_id)
        head_hex = check_head(job_id, job_row, head_row, expected_version, fence)
        if (bytes.fromhex(head_hex) if head_hex else GENESIS) != head:
            raise head_moved(job_id, expected_version)
        return self._insert_chained(job_id, expected_version, head, encoded)

    def _insert_chained(
        self, job_id: str, version: int, head: bytes, encoded: Sequence[Encoded]
    ) -> list[StoredEvent]:
        stored = chain_events(job_id, version, head, encoded)
        if stored:
            self.execute_many(
                EVENT_INSERT,
                [
                    (e.job_id, e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash)
                    for e in stored
                ],
            )
        return stored

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    # --- events -----------------------------------------------------------------------------

    @overload
    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent] = (),
        *,
        expected_version: int,
        fence: str | None = None,
        encoded: Sequence[Encoded] | None = None,
        head: bytes | None = None,
        hashes: Literal[False] = False,
    ) -> list[StoredEvent]: ...

    @overload
    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent] = (),
        *,
        expected_version: int,
        fence: str | None = None,
        encoded: Sequence[Encoded] | None = None,
        head: bytes | None = None,
        hashes: Literal[True],
    ) -> list[bytes]: ...

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent] = (),
        *,
        expected_version: int,
        fence: str | None = None,
        encoded: Sequence[Encoded] | None = None,
        head: bytes | None = None,
        hashes: bool = False,
    ) -> list[StoredEvent] | list[bytes]:
        """See :meth:`Transaction.append`. ``head`` lets the append skip reading the head back
        (it is refused exactly as without it); ``hashes`` lets a backend write the rows without
        building an event object per row (SQLite does, see :meth:`_append_hashes`)."""
        rows = self.sealed_rows(job_id, pre_encoded(events, encoded))
        if head is None:
            job_row, head_row = self._lock_and_head(job_id)
            head_hex = check_head(job_id, job_row, head_row, expected_version, fence)
            previous = bytes.fromhex(head_hex) if head_hex else GENESIS
            stored = self._insert_chained(job_id, expected_version, previous, rows)
        elif hashes:
            return self._append_hashes(job_id, rows, expected_version, fence, head)
        else:
            stored = self._append_after_head(job_id, rows, expected_version, fence, head)
        if hashes:
            return [bytes.fromhex(event.chain_hash) for event in stored]
        return stored

    def _append_hashes(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        expected_version: int,
        fence: str | None,
        head: bytes,
    ) -> list[bytes]:
        """An append after a known ``head`` returning only the new raw chain hashes; a backend
        may write the rows without building an event object per row."""
        stored = self._append_after_head(job_id, encoded, expected_version, fence, head)
        return [bytes.fromhex(event.chain_hash) for event in stored]

    def head(self, job_id: str) -> tuple[int, bytes]:
        """The job's last version and its raw chain hash (``0, b""`` for an empty log), read
        under the job's lock."""
        job_row, head_row = self._lock_and_head(job_id)
        if job_row is None:
            raise JobNotFound(job_id)
        if head_row is None:
            return 0, GENESIS
        return int(head_row[0]), bytes.fromhex(head_row[1])

    def list_events(self, job_id: str) -> list[StoredEvent]:
        """The job's whole log in version order, read in this transaction (so, on the
        transaction's own connection, as it sees the job)."""
        return [checked_event(row) for row in self.query(self.log_sql.events, (job_id,))]

    # --- jobs -------------------------------------------------------------------------------

    def create_job(
        self,
        *,
        job_id: str | None = None,
        namespace: str = "default",
        plan_name: str | None = None,
        idempotency_key: str | None = None,
        submitted_by: str | None = None,
        status: str = "pending",
    ) -> tuple[JobRecord, bool]:
        _check_status(status)
        row = (job_id or new_job_id(), namespace, plan_name, idempotency_key, submitted_by)
        return self.insert_jobs([row], status)[0]

    def insert_jobs(
        self, jobs: Sequence[tuple[str, str, str | None, str | None, str | None]], status: str
    ) -> list[tuple[JobRecord, bool]]:
        """Insert the rows of ``jobs`` (``(job_id, namespace, plan_name, idempotency_key,
        submitted_by)`` each) in ``status``, in order: each is :meth:`create_job`'s answer.
        The inserts are one round trip whatever their number (:meth:`query_each`)."""
        # The insert first: a key already used makes it a no-op (its unique index), and only
        # then is the key's job read — a new job costs one statement, not two.
        now = utc_now()
        # (and none if retention removed the key's job: a key never names a second job)
        inserted = self.query_each(
            [
                (_INSERT_JOB, (new_id, ns, status, plan, key, by, now, now, ns, key))
                for new_id, ns, plan, key, by in jobs
            ]
        )
        found: list[tuple[JobRecord, bool]] = []
        for (new_id, ns, plan, key, by), rows in zip(jobs, inserted, strict=True):
            if rows:
                job = JobRecord(new_id, ns, status, plan, key, by, now, now, 0, head_hash=None)
                found.append((job, True))
                continue
            if key is not None:
                # The key's job: from before, or a concurrent submitter's that committed first
                # (PostgreSQL waits for it).
                by_key = (
                    f"{self.log_sql.job_select} WHERE j.namespace = ? AND j.idempotency_key = ?"
                )
                existing = self._one(by_key, (ns, key))
                if existing is not None:
                    found.append((job_from_row(existing), False))
                    continue
                _refuse_an_archived_key(self, ns, key)
            raise StoreError(
                f"job id {new_id!r} already exists",
                hint="Choose another job id, or pass an idempotency key to get the existing job.",
            )
        return found

    def query_each(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Any]]:
        """:meth:`query` of each statement, in order; a backend whose reads are round trips
        sends them in one (PostgreSQL)."""
        return [self.query(sql, params) for sql, params in statements]

    def get_job(self, job_id: str, *, for_update: bool = False) -> JobRecord | None:
        if for_update:
            self._one("SELECT job_id FROM jobs WHERE job_id = ?" + self.FOR_UPDATE, (job_id,))
        row = self._one(f"{self.log_sql.job_select} WHERE j.job_id = ?", (job_id,))
        return job_from_row(row) if row is not None else None

    def update_job(
        self,
        job_id: str,
        *,
        status: str | None = None,
        output: Any = None,
        error: Any = None,
        fence: str | None = None,
    ) -> JobRecord:
        current = self.get_job(job_id, for_update=True)
        if current is None:
            raise JobNotFound(job_id)
        if fence is not None and current.attempt_id != fence:
            raise FencedError(
                f"job {job_id}: status change fenced off — attempt {fence} no longer holds "
                "the lease",
                job_id=job_id,
                fence=fence,
                current=current.attempt_id,
            )
        new_status = current.status if status is None else _check_status(status)
        sealed_out = self.sealed_column(job_id, output)
        sealed_err = self.sealed_column(job_id, error)
        out = canonical(sealed_out).decode() if output is not None else None
        err = canonical(sealed_err).decode() if error is not None else None
        now = utc_now()
        self.execute(_STATUS_UPDATE, (new_status, out, err, now, job_id))
        if new_status in TERMINAL_STATUSES:
            self.wake_parent(job_id)
        return replace(
            current,
            status=new_status,
            output=current.output if output is None else output,
            error=current.error if error is None else error,
            updated_at=now,
            unreadable=tuple(
                name
                for name, written in (("output", output), ("error", error))
                if name in current.unreadable and written is None
            )
            if current.unreadable
            else (),
        )

    def set_status(
        self, job_id: str, *, status: str, fence: str, output: Any = None, error: Any = None
    ) -> None:
        self.execute(
            STATUS_UPDATE_FENCED,
            (
                _check_status(status),
                None if output is None else canonical(self.sealed_column(job_id, output)).decode(),
                None if error is None else canonical(self.sealed_column(job_id, error)).decode(),
                utc_now(),
                job_id,
                fence,
            ),
        )
        if status in TERMINAL_STATUSES:
            self.wake_parent(job_id)

    def set_lease(
        self, job_id: str, *, attempt_id: str | None, owner: str | None, expires_at: float | None
    ) -> None:
        self.execute(
            "UPDATE jobs SET attempt_id = ?, lease_owner = ?, lease_expires_at = ? "
            "WHERE job_id = ?",
            (attempt_id, owner, expires_at, job_id),
        )


_STATUS_UPDATE = (
    "UPDATE jobs SET status = ?, output = COALESCE(?, output), error = COALESCE(?, error), "
    "updated_at = ? WHERE job_id = ?"
)
STATUS_UPDATE_FENCED = _STATUS_UPDATE + " AND attempt_id = ?"  # a run's end of its job


def _refuse_an_archived_key(rows: Any, namespace: str, idempotency_key: str) -> None:
    """A key names one job for good: also the one retention removed (a second job with it would
    run its side effects again).

    Raises:
        IdempotencyConflict: ``idempotency_key`` named a job retention archived.
    """
    from affidavit.store.retention import archived_key_job

    archived = archived_key_job(rows, namespace, idempotency_key)
    if archived is not None:
        raise IdempotencyConflict(
            f"idempotency key {idempotency_key!r} named job {archived.job_id}, which retention "
            f"removed from the live store at {archived.archived_at}",
            hint="A key never names a second job, also after its job was archived: "
            f"`affidavit verify {archived.job_id}` says where its pack is; use a new key for a "
            "new job.",
        )
