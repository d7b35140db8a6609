"""SQL shared by both backends: the transaction logic of append, jobs and leases.

Backends differ in connection handling, locking and durability (their own modules), in how
they keep a job's log (the reads of :class:`LogSql`: PostgreSQL by its ``(job_id, version)``
key, SQLite as a range of the rowid) and in the placeholder style: every SQL string here is
written with ``?`` placeholders, which the PostgreSQL backend converts.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.errors import (
    ConfigError,
    ConflictError,
    FencedError,
    InvalidEventError,
    JobNotFound,
    MigrationError,
    NoSchemaError,
    StoreError,
)
from affidavit.core.events import utc_now
from affidavit.core.ids import is_generated_id, new_event_ids, new_job_id
from affidavit.core.seal import PublicKey, Seal
from affidavit.store import migrations
from affidavit.store._apikeys import ApiKeyReads, ApiKeyWrites
from affidavit.store._cancels import CancelOps
from affidavit.store._ledger import LedgerOps
from affidavit.store._limits import LimitOps
from affidavit.store._sealkeys import SealKeyOps
from affidavit.store._seals import (
    KEYS_SELECT,
    LEGACY_SEAL_SELECT,
    SEAL_SELECT,
    SEALS_V2_MIGRATION,
    SealOps,
    key_from_row,
    seal_from_row,
)
from affidavit.store._tlog import TLOG_MIGRATION, TlogWrites
from affidavit.store._trust import TRUST_MIGRATION, TrustOps
from affidavit.store.base import (
    JOB_STATUSES,
    Claimed,
    Encoded,
    JobFilter,
    JobRecord,
    NewEvent,
    NextClaim,
    StoredEvent,
    T,
    checked_event,
    unmatchable,
)

if TYPE_CHECKING:
    from affidavit.store._snapshot import SqlSnapshot

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
MAX_INT64 = 2**63 - 1


class Cursor(Protocol):
    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...
    def executemany(self, sql: Any, params: Any, /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


_EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
# event types already found valid (a small vocabulary: checked once each, not once per event)
_VALID_TYPES: set[str] = set()
_VALID_TYPES_KEPT = 1024
_EVENT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}\Z")


def encode_events(events: Sequence[NewEvent]) -> list[Encoded]:
    """Canonicalize every payload once, before any lock is taken.

    Event types and ids are checked here because the chain formula separates them with spaces
    and newlines: a type or id containing one would make two different logs hash alike.
    """
    encoded: list[Encoded] = []
    fresh_ids = iter(new_event_ids(sum(1 for ev in events if ev.event_id is None)))
    valid_types = _VALID_TYPES
    for ev in events:
        event_type = ev.type if type(ev.type) is str else str(ev.type)
        if event_type not in valid_types:
            if not _EVENT_TYPE.match(event_type):
                raise InvalidEventError(
                    f"invalid event type {event_type!r}",
                    hint="Event types are lowercase snake_case (letters, digits, '_').",
                )
            if len(valid_types) < _VALID_TYPES_KEPT:
                valid_types.add(event_type)
        if ev.event_id is None:
            event_id = next(fresh_ids)
        else:
            event_id = ev.event_id
            if not _EVENT_ID.match(event_id):
                raise InvalidEventError(
                    f"invalid event id {event_id!r}",
                    hint="Event ids are 1-128 characters of letters, digits and _ . : -",
                )
            if is_generated_id(event_id):
                raise InvalidEventError(
                    f"event id {event_id!r} has the form of the ids the store makes",
                    hint="Leave event_id out to get a new id, or give one of another form "
                    "(32 lowercase hex digits of a UUIDv7 are reserved; the database keeps "
                    "every other id unique).",
                )
        if not isinstance(ev.payload, Mapping):
            raise InvalidEventError(f"{event_type} payload must be a JSON object")
        encoded.append((event_id, event_type, canonical(ev.payload)))
    return encoded


def _no_constant(name: str) -> Any:
    """NaN and ±Infinity: Python's parser takes them, JSON (and the store) has none."""
    raise ValueError(f"{name} is not JSON")


_UNREAD = object()  # a column that holds something the store never writes
# an escaped UTF-16 surrogate: the store's JCS text never holds one (it writes characters as
# they are), and a lone one is no Unicode text (no encoder takes it)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _read_json(raw: Any) -> Any:
    """The stored JSON text of a job's output or error, parsed; :data:`_UNREAD` for a value
    that is not JSON (the row was changed outside the store), so that the job is still read."""
    try:
        if isinstance(raw, bytes | bytearray | memoryview):  # (SQLite reads text as bytes)
            raw = bytes(raw).decode("utf-8")
        value = None if raw is None else json.loads(raw, parse_constant=_no_constant)
        if type(raw) is str and _SURROGATE_ESCAPE.search(raw):
            json.dumps(value, ensure_ascii=False).encode()  # a lone surrogate fails here
        return value
    except (ValueError, TypeError, RecursionError):
        return _UNREAD  # not UTF-8, not JSON, not text, nested too deeply, not Unicode


def job_from_row(row: Sequence[Any]) -> JobRecord:
    """A row of :attr:`LogSql.job_select`. An output or error that is not JSON is read as
    ``None`` and named in ``unreadable``."""
    output, error = _read_json(row[11]), _read_json(row[12])
    unreadable: tuple[str, ...] = ()
    if output is _UNREAD or error is _UNREAD:
        unreadable = tuple(
            name for name, value in (("output", output), ("error", error)) if value is _UNREAD
        )
        output = None if output is _UNREAD else output
        error = None if error is _UNREAD else error
    return JobRecord(
        job_id=row[0],
        namespace=row[1],
        status=row[2],
        plan_name=row[3],
        idempotency_key=row[4],
        submitted_by=row[5],
        created_at=row[6],
        updated_at=row[7],
        attempt_id=row[8],
        lease_owner=row[9],
        lease_expires_at=row[10],
        output=output,
        error=error,
        version=int(row[13]),
        head_hash=row[14],
        unreadable=unreadable,
    )


def event_from_row(row: Sequence[Any]) -> StoredEvent:
    """The event of a row of :data:`EVENT_COLUMNS`.

    Raises:
        UnreadableEventError: the row holds a value of another type than the store writes.
    """
    recorded = row[6]
    return checked_event(
        row, recorded if recorded is None or isinstance(recorded, str) else str(recorded)
    )


def fenced(job_id: str, fence: str, current: str | None) -> FencedError:
    return FencedError(
        f"job {job_id}: write fenced off — attempt {fence} no longer holds the lease "
        f"(current attempt: {current})",
        job_id=job_id,
        fence=fence,
        current=current,
    )


def conflict(job_id: str, expected: int, actual: int) -> ConflictError:
    return ConflictError(
        f"job {job_id}: expected version {expected}, but the log is at {actual}",
        job_id=job_id,
        expected=expected,
        actual=actual,
    )


def head_moved(job_id: str, version: int) -> ConflictError:
    """The log is at ``version`` but its last chain hash is not the one the writer holds."""
    return ConflictError(
        f"job {job_id}: the chain head at version {version} is not the one this writer holds",
        job_id=job_id,
        expected=version,
        actual=version,
    )


def check_head(
    job_id: str, job_row: Any, head_row: Any, expected_version: int, fence: str | None
) -> str | None:
    """Check a locked job's fence and version; return its head hash (``None`` when empty)."""
    if job_row is None:
        raise JobNotFound(job_id)
    attempt_id = job_row[0]
    version, head_hex = head_row if head_row is not None else (0, None)
    if fence is not None and attempt_id != fence:
        raise fenced(job_id, fence, attempt_id)
    if version != expected_version:
        raise conflict(job_id, expected_version, version)
    return head_hex


def chain_events(
    job_id: str, version: int, head: bytes, encoded: Sequence[Encoded]
) -> list[StoredEvent]:
    """The rows of ``encoded`` chained onto the head ``(version, head)`` (``head`` the raw
    ``H_version``, empty for an empty log): ``H_i`` is computed here, once, from the head —
    never from the whole log."""
    previous = head
    stored = []
    for event_id, event_type, payload in encoded:
        version += 1
        previous = chain_next(previous, event_id, event_type, payload)
        stored.append(StoredEvent(job_id, version, event_id, event_type, payload, previous.hex()))
    return stored


class SqlTransaction(
    LedgerOps, CancelOps, LimitOps, SealOps, SealKeyOps, ApiKeyWrites, TlogWrites, TrustOps, ABC
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

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int,
        fence: str | None = None,
    ) -> list[StoredEvent]:
        return self.append_encoded(
            job_id, encode_events(events), expected_version=expected_version, fence=fence
        )

    def append_encoded(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        *,
        expected_version: int,
        fence: str | None = None,
        head: bytes | None = None,
    ) -> list[StoredEvent]:
        """Append already-canonicalized events (see :func:`encode_events`).

        ``head``: the raw chain hash of event ``expected_version`` (empty when it is 0), for a
        writer that knows it because it wrote that event (a run holding the job's lease). The
        append is refused exactly as without it — fenced, or a :class:`ConflictError` when the
        log is not at ``expected_version`` — but need not read the head back.
        """
        if head is not None:
            return self._append_after_head(job_id, encoded, expected_version, fence, head)
        job_row, head_row = self._lock_and_head(job_id)
        head_hex = check_head(job_id, job_row, head_row, expected_version, fence)
        previous = bytes.fromhex(head_hex) if head_hex else GENESIS
        return self._insert_chained(job_id, expected_version, previous, encoded)

    def append_known_head(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        *,
        expected_version: int,
        fence: str | None,
        head: bytes,
    ) -> list[bytes]:
        """:meth:`append_encoded` with ``head`` (a writer that knows it), returning only the new
        events' raw chain hashes — what a run keeps of an append. A backend may write the rows
        without building an event object per row (SQLite does)."""
        stored = self.append_encoded(
            job_id, encoded, expected_version=expected_version, fence=fence, head=head
        )
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
        by_key = f"{self.log_sql.job_select} WHERE j.namespace = ? AND j.idempotency_key = ?"
        if idempotency_key is not None:
            existing = self._one(by_key, (namespace, idempotency_key))
            if existing is not None:
                return job_from_row(existing), False
        now = utc_now()
        new_id = job_id or new_job_id()
        inserted = self._one(
            f"INSERT INTO jobs ({JOB_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, NULL, NULL) "
            "ON CONFLICT DO NOTHING RETURNING job_id",
            (new_id, namespace, status, plan_name, idempotency_key, submitted_by, now, now),
        )
        if inserted is not None:
            job = JobRecord(
                job_id=new_id,
                namespace=namespace,
                status=status,
                plan_name=plan_name,
                idempotency_key=idempotency_key,
                submitted_by=submitted_by,
                created_at=now,
                updated_at=now,
                version=0,
                head_hash=None,
            )
            return job, True
        if idempotency_key is not None:
            # A concurrent submitter with the same key committed first (PostgreSQL waits for it).
            existing = self._one(by_key, (namespace, idempotency_key))
            if existing is not None:
                return job_from_row(existing), False
        raise StoreError(
            f"job id {new_id!r} already exists",
            hint="Choose another job id, or pass an idempotency key to get the existing job.",
        )

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
        out = canonical(output).decode() if output is not None else None
        err = canonical(error).decode() if error is not None else None
        now = utc_now()
        self.execute(_STATUS_UPDATE, (new_status, out, err, now, job_id))
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
                canonical(output).decode() if output is not None else None,
                canonical(error).decode() if error is not None else None,
                utc_now(),
                job_id,
                fence,
            ),
        )

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


def _check_status(status: str) -> str:
    if status not in JOB_STATUSES:
        raise ConfigError(
            f"unknown job status {status!r}", hint=f"Use one of: {', '.join(JOB_STATUSES)}."
        )
    return status


# The hint of the StoreUnavailable a write raises when the disk holding the database is full
# (SQLite: SQLITE_FULL; PostgreSQL: SQLSTATE 53100).
FULL_DISK_HINT = (
    "The disk holding the database is full (or the database reached its size limit): free "
    "space. Nothing recorded is lost; a job whose run gave up meanwhile is taken up again by a "
    "worker once its lease expires."
)

# newest first; the job id breaks ties so that paging is stable (each filter has an index in
# this order: migration 8)
JOBS_SORT = "ORDER BY j.created_at DESC, j.job_id DESC"
JOBS_ORDER = f"{JOBS_SORT} LIMIT ? OFFSET ?"


def jobs_where(f: JobFilter) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause (``""`` or starting with a space) of a job listing over ``jobs j``
    and its parameters, the limit and offset of :data:`JOBS_ORDER` last.

    Raises:
        ConfigError: an unknown status, a filter holding a NUL or text that is not UTF-8, or a
            limit or offset out of range.
    """
    where: list[str] = []
    params: list[Any] = []
    if f.status:
        for s in f.status:
            _check_status(s)
        where.append("j.status IN (" + ", ".join("?" for _ in f.status) + ")")
        params.extend(f.status)
    for text in (f.namespace, f.plan_name, *(f.status or ())):
        if text is not None and unmatchable(text):
            raise ConfigError(f"filter value {text!r} holds a NUL or a byte that is not UTF-8")
    if f.namespace is not None:
        where.append("j.namespace = ?")
        params.append(f.namespace)
    if f.plan_name is not None:
        where.append("j.plan_name = ?")
        params.append(f.plan_name)
    if f.before is not None:
        if unmatchable(f.before):
            raise ConfigError(f"job id {f.before!r} holds a NUL or a byte that is not UTF-8")
        # a row value of plain operands (the cursor's created_at an uncorrelated scalar
        # subquery), so both databases read it as a range of the listing's index; a cursor
        # naming no job compares as NULL and lists nothing (see SqlStore.list_jobs)
        where.append(
            "(j.created_at, j.job_id) < ((SELECT c.created_at FROM jobs c WHERE c.job_id = ?), ?)"
        )
        params.extend((f.before, f.before))
    if not (1 <= f.limit <= MAX_INT64 and 0 <= f.offset <= MAX_INT64):
        raise ConfigError("limit must be ≥ 1 and offset ≥ 0 (and both below 2^63)")
    params.extend((f.limit, f.offset))
    return (" WHERE " + " AND ".join(where) if where else ""), params


class SqlStore(ApiKeyReads, ABC):
    """The :class:`~affidavit.store.base.Store` methods both backends share. A backend supplies
    connections: ``_reader()`` (a cursor for reads) and ``transaction()``."""

    url: str
    backend: str
    log_sql = BY_JOB_ID
    seal_select = SEAL_SELECT  # (LEGACY_SEAL_SELECT on a copy made before migration 12)
    tlog_tables = True  # (False on a copy made before migration 10)
    trust_tables = True  # (False on a copy made before migration 15, read as it is)

    @abstractmethod
    def _reader(self) -> AbstractContextManager[Cursor]: ...

    def _log_reader(self) -> AbstractContextManager[Cursor]:
        """:meth:`_reader` for a log in key order (``list_events``, whole or a page): where a
        backend's planner may sort the job's whole log for the read (for each page of a paged
        read), it is told not to (see :class:`~affidavit.store.postgres.PostgresStore`)."""
        return self._reader()

    @abstractmethod
    def transaction(self, *, durable: bool = True) -> AbstractContextManager[SqlTransaction]: ...

    @abstractmethod
    def snapshot(self, *, lenient_text: bool = False) -> AbstractContextManager[SqlSnapshot]: ...

    def _q(self, sql: str) -> str:
        return sql

    def _read_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._reader() as cur:
            cur.execute(self._q(sql), params)
            return list(cur.fetchall())

    @abstractmethod
    def schema_version(self) -> int: ...

    def check_schema(self) -> None:
        """Refuse a database whose schema this affidavit cannot read as it is: what a store
        opened read-only checks instead of migrating. Pending migrations are accepted when a
        read-only store still reads the schema before each
        (``Migration.older_schema_readable``), so an auditor can verify a copy made before
        such an upgrade.

        Raises:
            MigrationError: no affidavit schema, a pending migration that changes what is
                read, or a newer or different schema.
        """
        name = "sqlite" if self.backend == "sqlite" else "postgres"
        if self.schema_version() == 0:
            raise NoSchemaError(
                "the database holds no affidavit schema",
                hint="Point --db at an affidavit database (a command that writes, such as "
                "`affidavit db migrate`, creates the schema).",
            )
        known = migrations.load(name)
        applied = [
            int(r[0]) for r in self._read_rows(f"SELECT version FROM {migrations.VERSION_TABLE}")
        ]
        pending = migrations.pending(name, applied, known)  # (raises for a newer schema)
        if any(m.version == SEALS_V2_MIGRATION for m in pending):
            self.seal_select = LEGACY_SEAL_SELECT  # (seals have no version column yet)
        if any(m.version == TLOG_MIGRATION for m in pending):
            self.tlog_tables = False  # (no log tables yet: a job has no leaves)
        if any(m.version == TRUST_MIGRATION for m in pending):
            self.trust_tables = False  # (no outcome and no trust seal yet)
        if not all(m.older_schema_readable for m in pending):
            raise MigrationError(
                f"the database schema is at version {max(applied)}, older than this "
                f"affidavit's ({known[-1].version}); it is not migrated when opened read-only",
                hint="Run `affidavit db migrate` with write access to the database first.",
            )

    def claim(
        self,
        *,
        owner: str,
        attempt_id: str,
        now: float,
        lease_seconds: float,
        job_id: str | None = None,
        skip: Collection[str] = (),
        with_log: bool = False,
    ) -> Claimed | None:
        with self.transaction(durable=False) as tx:
            tx.commit_with_next_read()
            return tx.claim(
                owner=owner,
                attempt_id=attempt_id,
                now=now,
                lease_seconds=lease_seconds,
                job_id=job_id,
                skip=skip,
                with_log=with_log,
            )

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int,
        fence: str | None = None,
        durable: bool = True,
    ) -> list[StoredEvent]:
        encoded = encode_events(events)
        with self.transaction(durable=durable) as tx:
            return tx.append_encoded(
                job_id, encoded, expected_version=expected_version, fence=fence
            )

    def create_job(
        self,
        *,
        job_id: str | None = None,
        namespace: str = "default",
        plan_name: str | None = None,
        idempotency_key: str | None = None,
        submitted_by: str | None = None,
        events: Sequence[NewEvent] = (),
        durable: bool = True,
    ) -> tuple[JobRecord, bool]:
        encoded = encode_events(events)
        with self.transaction(durable=durable) as tx:
            job, created = tx.create_job(
                job_id=job_id,
                namespace=namespace,
                plan_name=plan_name,
                idempotency_key=idempotency_key,
                submitted_by=submitted_by,
            )
            if created and encoded:
                stored = tx.append_encoded(job.job_id, encoded, expected_version=0)
                job = replace(job, version=stored[-1].version, head_hash=stored[-1].chain_hash)
            return job, created

    def get_job(self, job_id: str) -> JobRecord:
        if unmatchable(job_id):  # no job can have it
            raise JobNotFound(job_id)
        with self._reader() as cur:
            cur.execute(self._q(f"{self.log_sql.job_select} WHERE j.job_id = ?"), (job_id,))
            row = cur.fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return job_from_row(row)

    def list_jobs(self, filters: JobFilter | None = None) -> list[JobRecord]:
        where, params = jobs_where(filters or JobFilter())
        # The page's ids first, off an index and reading no other column; only then each
        # listed job's chain head (its last event): a deep offset skips index entries, not
        # joins.
        page = f"SELECT j.job_id FROM jobs j{where} {JOBS_ORDER}"
        sql = f"{self.log_sql.job_select} WHERE j.job_id IN ({page}) {JOBS_SORT}"
        with self._reader() as cur:
            cur.execute(self._q(sql), params)
            rows = cur.fetchall()
            if not rows and filters is not None and filters.before is not None:
                cur.execute(self._q("SELECT 1 FROM jobs WHERE job_id = ?"), (filters.before,))
                if cur.fetchone() is None:
                    raise JobNotFound(filters.before)
            return [job_from_row(r) for r in rows]

    def list_events(
        self, job_id: str, *, after_version: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        sql = self.log_sql.after
        if not 0 <= after_version <= MAX_INT64 or (
            limit is not None and not 1 <= limit <= MAX_INT64
        ):
            raise ConfigError("after_version must be ≥ 0 and limit ≥ 1 (and both below 2^63)")
        if unmatchable(job_id):
            return []  # no job can have it
        params: list[Any] = [job_id, after_version]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._log_reader() as cur:
            cur.execute(self._q(sql), params)
            return [event_from_row(r) for r in cur.fetchall()]

    def iter_events(
        self, job_id: str, *, batch: int = 1000, after_version: int = 0, limit: int | None = None
    ) -> Iterator[StoredEvent]:
        after, left = after_version, limit
        while left is None or left > 0:
            size = batch if left is None else min(batch, left)
            page = self.list_events(job_id, after_version=after, limit=size)
            yield from page
            if len(page) < size:
                return
            after = page[-1].version
            left = None if left is None else left - len(page)

    def with_text_fallback(self, read: Callable[[bool], T]) -> T:
        # (a backend whose text is always valid: nothing to fall back to; SQLite overrides it)
        return read(False)

    def get_seal(self, job_id: str) -> Seal | None:
        with self._reader() as cur:
            cur.execute(self._q(self.seal_select), (job_id,))
            row = cur.fetchone()
        return seal_from_row(row) if row is not None else None

    def signing_keys(self) -> list[PublicKey]:
        with self._reader() as cur:
            cur.execute(self._q(KEYS_SELECT))
            return [key_from_row(r) for r in cur.fetchall()]
