"""The embedded backend: one SQLite file in WAL mode, through the ``apsw`` driver (and the
SQLite it bundles), which does less around each statement than Python's ``sqlite3``. Two copies
of SQLite must not open one file in one process (see :class:`RawConnection`).

Concurrency model: one writer connection per process, guarded by a lock, so threads of one
process take turns; each write transaction starts with ``BEGIN IMMEDIATE``, which takes SQLite's
write lock up front and waits (busy timeout) for writers in other processes. Readers use one
connection per thread and, thanks to WAL, never block the writer.

Durability per transaction: ``durable=True`` commits with ``synchronous=FULL`` (the WAL is
fsynced before COMMIT returns); ``durable=False`` uses ``synchronous=NORMAL`` (written, fsynced
by the next durable commit or checkpoint: WAL frames are ordered, so a durable commit covers
every earlier one). The writer switches its ``synchronous`` level only when a transaction needs
the other one.

A job's log is one range of the events table's rowid: each job has a number (``jobs.number``,
given by a trigger when the row is inserted), and an event's ``seq`` is
``(number << 32) + version``. The rowid keeps a log in order and each position unique, so no
second B-tree on ``(job_id, version)`` is written by every append (migration 6). Reads take the
range and also require the row's ``job_id``. A job's log holds at most 2^32 - 1 events here.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, cast
from urllib.parse import quote

import apsw

from affidavit.core.chain import chain_next
from affidavit.core.errors import (
    CancelRequestedError,
    JobNotFound,
    StoreError,
    StoreUnavailable,
)
from affidavit.core.events import utc_now
from affidavit.store import migrations
from affidavit.store._cancels import CANCEL_REFUSAL
from affidavit.store._snapshot import SqlSnapshot
from affidavit.store._sql import (
    BY_JOB_ID,
    EVENT_COLUMNS,
    Cursor,
    LogSql,
    SqlTransaction,
    job_row_select,
)
from affidavit.store._sql_rows import (
    FULL_DISK_HINT,
    conflict,
    fenced,
)
from affidavit.store._sql_store import SqlStore
from affidavit.store.base import Encoded, StoredEvent, T
from affidavit.store.migrations import Migration

DEFAULT_BUSY_TIMEOUT_S = 30.0


MAX_VERSION = 2**32 - 1
# The first seq of the job named by ?1 (NULL for no such job), and its events in order.
_LOG_START = "(SELECT number << 32 FROM jobs WHERE job_id = ?1)"
_LOG = f"seq BETWEEN {_LOG_START} + 1 AND {_LOG_START} + {MAX_VERSION} AND job_id = ?1 ORDER BY seq"
# The seq of the job's last event (correlated with `j`, a jobs row): a descending walk of the
# job's range, which stops at its first row.
_LAST_SEQ = (
    "(SELECT seq FROM events WHERE seq BETWEEN (j.number << 32) + 1 "
    f"AND (j.number << 32) + {MAX_VERSION} AND job_id = j.job_id ORDER BY seq DESC LIMIT 1)"
)
# A job's output and error as bytes when they are text: text that is not UTF-8 (a row edited
# outside the store) then reads as unreadable JSON, instead of failing the read of the job.
_AS_BYTES = "CASE WHEN typeof({c}) = 'text' THEN CAST({c} AS BLOB) ELSE {c} END"
BY_RANGE = LogSql(
    job_select=job_row_select(_AS_BYTES.format(c="j.output"), _AS_BYTES.format(c="j.error"))
    + f"ON e.seq = {_LAST_SEQ}",
    after=(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > {_LOG_START} + min(?2, {MAX_VERSION}) "
        f"AND seq <= {_LOG_START} + {MAX_VERSION} AND job_id = ?1 ORDER BY seq"
    ),
    rows=f"SELECT version, event_id, type, payload, chain_hash FROM events WHERE {_LOG}",
    events=f"SELECT job_id, version, event_id, type, payload, chain_hash FROM events WHERE {_LOG}",
    hashes=f"SELECT chain_hash FROM events WHERE {_LOG}",
    position="seq",
    # one pass over the events table, each row's job looked up by its id and the job whose
    # range holds it by number (both indexed); rows of no job row are orphans, read elsewhere
    misplaced=(
        "SELECT e.job_id, e.version, e.seq, h.job_id FROM events e "
        "JOIN jobs o ON o.job_id = e.job_id LEFT JOIN jobs h ON h.number = e.seq >> 32 "
        f"WHERE e.seq NOT BETWEEN (o.number << 32) + 1 AND (o.number << 32) + {MAX_VERSION} "
        "ORDER BY e.job_id, e.seq"
    ),
)
# the append guard: (the job's attempt id, its number, whether the row before the first new one
# is in its log)
_GUARD = (
    "SELECT attempt_id, number, ? = 0 OR EXISTS "
    "(SELECT 1 FROM events WHERE seq = (number << 32) + ? AND job_id = jobs.job_id) "
    "FROM jobs WHERE job_id = ?"
)
_JOB_NUMBER = "SELECT number FROM jobs WHERE job_id = ?"
_HELD_BY = (
    "SELECT seq, job_id FROM events WHERE seq BETWEEN ? AND ? AND job_id <> ? ORDER BY seq LIMIT 1"
)
_LAST_VERSION = (
    f"SELECT coalesce((SELECT e.version FROM jobs j JOIN events e ON e.seq = {_LAST_SEQ} "
    "WHERE j.job_id = ?), 0)"
)
# rows per INSERT statement: 7 parameters each, far below SQLite's variable limit (999 in old
# builds)
_CHUNK = 100


@functools.lru_cache(maxsize=64)
def _insert_rows(count: int) -> str:
    """The INSERT of ``count`` event rows (``recorded_at`` given: cheaper than the column's
    default, which SQLite would compute per row)."""
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * count)
    return (
        "INSERT INTO events (seq, job_id, version, event_id, type, payload, chain_hash, "
        f"recorded_at) VALUES {values}"
    )


def _recorded_at() -> str:
    """Now, as the ``recorded_at`` column's default writes it (milliseconds)."""
    return utc_now()[:23] + "Z"


_JOB_AND_HEAD = (
    f"SELECT j.attempt_id, e.version, e.chain_hash FROM jobs j LEFT JOIN events e "
    f"ON e.seq = {_LAST_SEQ} WHERE j.job_id = ?"
)


class SqliteTransaction(SqlTransaction):
    """Statements run at once on the writer connection, through its one cursor (a cursor per
    statement costs more than the statement's own bookkeeping). No row locks are needed:
    ``BEGIN IMMEDIATE`` already holds the database write lock."""

    log_sql = BY_RANGE

    def __init__(self, conn: apsw.Connection, cursor: apsw.Cursor) -> None:
        self._conn = conn
        self._cur = cursor

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._cur.execute(sql, params)

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if len(rows) == 1:
            self._cur.execute(sql, rows[0])
        else:
            self._cur.executemany(sql, rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return _all(self._cur, sql, params)

    def inserted(self, sql: str, params: Sequence[Any]) -> bool:
        # the count of changed rows, not RETURNING (which SQLite buffers in a temporary table)
        self._cur.execute(sql, params)
        return self._conn.changes() == 1

    def _lock_and_head(self, job_id: str) -> tuple[Any, Any]:
        # The write lock is held since BEGIN IMMEDIATE, so one statement reads both.
        row = _one(self._cur, _JOB_AND_HEAD, (job_id,))
        if row is None:
            return None, None
        return (row[0],), (row[1], row[2]) if row[1] is not None else None

    def _insert_chained(
        self, job_id: str, version: int, head: bytes, encoded: Sequence[Encoded]
    ) -> list[StoredEvent]:
        # (after _lock_and_head: the job exists, the fence holds and the log is at `version`)
        (number,) = _all(self._cur, _JOB_NUMBER, (job_id,))[0]
        return self._write(job_id, version, head, encoded, int(cast(int, number)), [])[0]

    def _append_after_head(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        expected_version: int,
        fence: str | None,
        head: bytes,
    ) -> list[StoredEvent]:
        number = self._guard(job_id, expected_version, fence)
        return self._write(job_id, expected_version, head, encoded, number, [])[0]

    def _append_hashes(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        expected_version: int,
        fence: str | None,
        head: bytes,
    ) -> list[bytes]:
        # (a run's appends: no event object per row)
        number = self._guard(job_id, expected_version, fence)
        return self._write(job_id, expected_version, head, encoded, number, None)[1]

    def _guard(self, job_id: str, expected_version: int, fence: str | None) -> int:
        """Check that the job exists, that the fence holds and that the log is at
        ``expected_version``; return the job's number.

        The write lock is held since BEGIN IMMEDIATE, so the state cannot change under us:
        one query checks that the job exists, that the fence holds and that the row before
        the first new one is in the log; then plain INSERTs write the rows. A log that moved
        past expected_version is refused by the rowid (the first new row's seq is taken);
        one that has not reached it, by the guard. (Folding the guard into the INSERT as a
        WHERE clause costs more: a SELECT that reads the table it inserts into makes SQLite
        copy the rows through a temporary table first.)"""
        found = _one(self._cur, _GUARD, (expected_version, expected_version, job_id))
        if found is None:
            raise JobNotFound(job_id)
        if fence is not None and found[0] != fence:
            raise fenced(job_id, fence, found[0])
        if not found[2]:
            raise self._conflict(job_id, expected_version)
        return int(found[1])

    def _write(
        self,
        job_id: str,
        version: int,
        head: bytes,
        encoded: Sequence[Encoded],
        number: int,
        stored: list[StoredEvent] | None,
    ) -> tuple[list[StoredEvent], list[bytes]]:
        """Chain ``encoded`` onto the head ``(version, head)`` of the job numbered ``number``
        and insert the rows; return them (appended to ``stored``; none kept when it is
        ``None``) and their raw chain hashes. The chain and the INSERT's parameters are made in
        one pass (:func:`~affidavit.store._sql_rows.chain_events` computes the same hashes)."""
        count = len(encoded)
        if not count:
            return stored or [], []
        _check_size(job_id, version + count)
        base, first = number << 32, version
        params: list[Any] = []
        recorded = _recorded_at()
        hashes: list[bytes] = []
        for event_id, event_type, payload in encoded:
            version += 1
            head = chain_next(head, event_id, event_type, payload)
            hashes.append(head)
            hash_hex = head.hex()
            params += (base + version, job_id, version, event_id, event_type, payload)
            params += (hash_hex, recorded)
            if stored is not None:
                stored.append(StoredEvent(job_id, version, event_id, event_type, payload, hash_hex))
        span = (base + first + 1, base + version)
        if count <= _CHUNK:
            self._insert(job_id, first, count, params, span)
            return stored or [], hashes
        # several statements: all of them or none, even if the caller goes on after an error
        width = len(params) // count
        self._cur.execute("SAVEPOINT affidavit_append")
        try:
            for start in range(0, count, _CHUNK):
                rows = min(_CHUNK, count - start)
                chunk = params[start * width : (start + rows) * width]
                self._insert(job_id, first, rows, chunk, span)
        except BaseException:
            self._cur.execute("ROLLBACK TO affidavit_append")
            raise
        finally:
            self._cur.execute("RELEASE affidavit_append")
        return stored or [], hashes

    def _insert(
        self,
        job_id: str,
        expected_version: int,
        count: int,
        params: list[Any],
        span: tuple[int, int],
    ) -> None:
        """One INSERT of ``count`` rows; a row already at one of their positions (``span``,
        the seqs the append writes) is a :class:`ConflictError` (see :meth:`_conflict`)."""
        try:
            self._cur.execute(_insert_rows(count), params)
        except apsw.ConstraintError as exc:
            if "events.seq" not in str(exc):
                raise
            raise self._conflict(job_id, expected_version, span) from None

    def _conflict(
        self, job_id: str, expected_version: int, span: tuple[int, int] | None = None
    ) -> Exception:
        """A :class:`ConflictError` with the log's version; a :class:`StoreError` naming the
        row when a position of ``span`` (the seqs being written) is held by a row of another
        job — a row in no log, which only a write that bypassed the store can have made."""
        if span is not None:
            held = _one(self._cur, _HELD_BY, (*span, job_id))
            if held is not None:
                seq, other = held
                return StoreError(
                    f"job {job_id}: the position of version {seq & MAX_VERSION} (seq {seq}) is "
                    f"held by a row of job {other!r} that was written outside affidavit",
                    hint="Rows put into the events table by hand must give seq = "
                    "(jobs.number << 32) + version (see docs/storage.md); remove that row.",
                )
        (actual,) = _all(self._cur, _LAST_VERSION, (job_id,))[0]
        return conflict(job_id, expected_version, int(cast(int, actual)))


def _check_size(job_id: str, last_version: int) -> None:
    if last_version > MAX_VERSION:
        raise StoreError(
            f"job {job_id}: a log on SQLite holds at most {MAX_VERSION:,} events",
            hint="Split the work into several jobs.",
        )


# Primary result codes (the low byte of an extended code) of failures that may pass: a lock
# another process held past the busy timeout, an I/O error, a full disk.
_TRANSIENT = frozenset(
    {
        apsw.SQLITE_BUSY,
        apsw.SQLITE_LOCKED,
        apsw.SQLITE_IOERR,
        apsw.SQLITE_FULL,
        apsw.SQLITE_PROTOCOL,
    }
)


_CANTOPEN = apsw.SQLITE_CANTOPEN


class TextNotUtf8(Exception):
    """SQLite TEXT that is not UTF-8 (a row edited outside the store), which the driver does
    not decode. Not a ``ValueError`` (as the driver's ``UnicodeDecodeError`` is): code that
    reads a value and catches malformed values must not mistake a failed read for one."""


# What a read of this store can raise: SQLite's errors, and text that is not UTF-8.
READ_ERRORS = (apsw.Error, TextNotUtf8, UnicodeDecodeError)


def _all(cursor: apsw.Cursor, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """The rows of ``sql`` run on ``cursor`` (:class:`TextNotUtf8` for text that is not UTF-8;
    the driver reads the first row as it runs the statement)."""
    try:
        return cursor.execute(sql, params).fetchall()
    except UnicodeDecodeError as exc:
        raise TextNotUtf8(str(exc)) from exc


def _one(cursor: apsw.Cursor, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first row of ``sql`` run on ``cursor``, ``None`` for none (as :func:`_all`)."""
    try:
        return cursor.execute(sql, params).fetchone()
    except UnicodeDecodeError as exc:
        raise TextNotUtf8(str(exc)) from exc


def _streamed(cursor: apsw.Cursor) -> Iterator[Any]:
    """``cursor``'s rows, one at a time (as :func:`_all`)."""
    try:
        yield from cursor
    except UnicodeDecodeError as exc:
        raise TextNotUtf8(str(exc)) from exc


def store_error(message: str, exc: BaseException) -> StoreError:
    """``exc`` as a :class:`StoreError`; a :class:`StoreUnavailable` when it may pass."""
    code = getattr(exc, "extendedresult", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = f"{message}: {_describe(exc)}"
    if primary == apsw.SQLITE_FULL:
        return StoreUnavailable(text, hint=FULL_DISK_HINT)
    if primary == apsw.SQLITE_READONLY:
        # the file, its directory or its filesystem became read-only (a remount after disk
        # errors, an operator's chmod): may pass once it is writable again, as a full disk
        return StoreUnavailable(text, hint=READ_ONLY_HINT)
    return (StoreUnavailable if primary in _TRANSIENT else StoreError)(text)


READ_ONLY_HINT = (
    "The database file, its directory or its filesystem is read-only (a remount after disk "
    "errors, a permission change): make it writable again for the user running affidavit. "
    "Nothing recorded is lost; a job whose run gave up meanwhile is taken up again by a worker "
    "once its lease expires."
)


def _describe(exc: BaseException) -> str:
    """The error as SQLite words it (the driver prefixes its class name: dropped)."""
    text = str(exc)
    prefix = f"{type(exc).__name__}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


class _WriteTransaction:
    """:meth:`SqliteStore.transaction`: the writer connection inside ``BEGIN IMMEDIATE``,
    committed on a clean exit and rolled back otherwise (a class rather than a generator:
    every tool step opens two)."""

    __slots__ = ("_durable", "_store")

    def __init__(self, store: SqliteStore, durable: bool) -> None:
        self._store = store
        self._durable = durable

    def __enter__(self) -> SqlTransaction:
        store, durable = self._store, self._durable
        store._write_lock.acquire()
        try:
            if store._in_write:
                raise StoreError(
                    "nested write transaction", hint="Pass the open transaction down instead."
                )
            cursor = store._writer_cursor
            try:
                if durable != store._full_sync:
                    cursor.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                    store._full_sync = durable
                cursor.execute("BEGIN IMMEDIATE")
            except apsw.Error as exc:
                raise store_error(
                    f"cannot start a write transaction on {store.path!r}", exc
                ) from exc
        except BaseException:
            store._write_lock.release()
            raise
        store._in_write = True
        tx = SqliteTransaction(store._writer, cursor)
        tx.trust_tables = store.trust_tables
        return tx

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        store = self._store
        cursor = store._writer_cursor
        try:
            if exc is None:
                try:
                    cursor.execute("COMMIT")
                    return
                except apsw.Error as commit_error:
                    exc = commit_error  # rolled back and reported as below
            if store._writer.in_transaction:
                cursor.execute("ROLLBACK")
            if isinstance(exc, apsw.ConstraintError) and CANCEL_REFUSAL in str(exc):
                raise CancelRequestedError("the job was asked to cancel", job_id="") from None
            if isinstance(exc, READ_ERRORS):
                raise store_error(f"SQLite write failed on {store.path!r}", exc) from exc
        finally:
            store._in_write = False
            store._write_lock.release()


_IDLE_SNAPSHOTS = 4  # connections kept for the next snapshots
_STATEMENT_CACHE = 256  # prepared statements kept per connection (the store has ~150)


def is_text_decode_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is SQLite text that is not UTF-8 failing a read."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return isinstance(cause, (TextNotUtf8, UnicodeDecodeError))


@functools.lru_cache(maxsize=128)
def _lenient_select(sql: str, columns: int) -> str:
    """``sql`` with each of its ``columns`` result columns as two: whether the value is text,
    and the value — text as its bytes (the driver decodes text strictly; see
    :meth:`SqliteSnapshot._lenient_rows`). The columns are renamed by position (a CTE's column
    list), so any result column names work; the rows keep the query's order."""
    names = [f"c{i}" for i in range(columns)]
    pairs = ", ".join(
        f"typeof({c}) = 'text', CASE WHEN typeof({c}) = 'text' THEN CAST({c} AS BLOB) ELSE {c} END"
        for c in names
    )
    return f"WITH q({', '.join(names)}) AS ({sql}) SELECT {pairs} FROM q"


class SqliteSnapshot(SqlSnapshot):
    """Reads inside one deferred read transaction: WAL keeps its snapshot from the first read
    until the end, whatever writers commit meanwhile. ``lenient_text``: TEXT that is not
    UTF-8 is read as ``str`` all the same, its bad bytes as lone surrogates (which no encoder
    accepts, so the value is reported rather than read as something else)."""

    def __init__(self, conn: apsw.Connection, log_sql: LogSql, lenient_text: bool = False) -> None:
        self._conn = conn
        self.log_sql = log_sql
        self._lenient = lenient_text
        self._streams: list[apsw.Cursor] = []

    def _end(self) -> None:
        """Close the streams the caller may have left unfinished: a statement still active
        would keep this snapshot's read transaction open past its ROLLBACK, and the next
        snapshot on the connection would see the database as of this one."""
        for cursor in self._streams:
            cursor.close()
        self._streams.clear()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if self._lenient:
            return list(self._lenient_rows(sql, params))
        return _all(self._conn.cursor(), sql, params)

    def stream(self, sql: str, params: Sequence[Any], batch: int) -> Iterator[Sequence[Any]]:
        # SQLite steps one row at a time whatever the batch. The cursor is closed when the
        # snapshot ends (_end); errors raised while iterating are the driver's, which the
        # snapshot turns into StoreError.
        del batch
        if self._lenient:
            return self._lenient_rows(sql, params)
        cursor = self._conn.cursor()
        self._streams.append(cursor)
        try:
            return _streamed(cursor.execute(sql, params))
        except UnicodeDecodeError as exc:  # (in the first row, which the driver reads at once)
            raise TextNotUtf8(str(exc)) from exc

    def _lenient_rows(self, sql: str, params: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
        import apsw.ext  # (~40 ms to import: only lenient reads need it)

        columns = len(apsw.ext.query_info(self._conn, sql).description or ())
        cursor = self._conn.cursor()
        self._streams.append(cursor)
        for row in cursor.execute(_lenient_select(sql, columns), params):
            flags, values = row[0::2], row[1::2]
            yield tuple(
                v.decode("utf-8", "surrogateescape") if text else v
                for text, v in zip(flags, values, strict=True)
            )


class SqliteStore(SqlStore):
    """A :class:`~affidavit.store.base.Store` on one SQLite file."""

    backend = "sqlite"
    log_sql = BY_RANGE

    def __init__(
        self,
        url: str,
        path: str,
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        migrate: bool = True,
        read_only: bool = False,
    ) -> None:
        self.url = url
        self.path = path
        self.read_only = read_only
        self._busy_timeout_s = busy_timeout_s
        parent = Path(path).resolve().parent
        if not parent.is_dir():
            raise StoreError(
                f"cannot open SQLite database {path!r}: directory {str(parent)!r} does not exist",
                hint="Create the directory first, or choose another path in the sqlite:/// URL.",
            )
        # Read-only: every connection is opened with mode=ro (nothing is created, migrated or
        # written). In a directory this process cannot write, without a -wal file (a copy
        # kept as evidence, a read-only mount), SQLite cannot create the shared-memory file
        # WAL mode reads through; such a file cannot change under us, so it is opened as
        # immutable. With a -wal file beside it, its committed transactions are needed: no
        # fallback then (the error's hint says what to do).
        self._uri: str | None = None
        if read_only:
            if not Path(path).is_file():
                raise StoreError(
                    f"no SQLite database at {path!r}",
                    hint="Check the path in the sqlite:/// URL; reading commands never create "
                    "a database.",
                )
            self._uri = f"file:{quote(str(Path(path).resolve()))}?mode=ro"
            if not os.access(parent, os.W_OK) and not Path(path + "-wal").exists():
                self._uri += "&immutable=1"
        # (a read-only store removes the -wal and -shm files its reads made: see close)
        self._made_sidecars = read_only and not any(
            Path(path + suffix).exists() for suffix in ("-wal", "-shm")
        )
        self._write_lock = threading.RLock()
        self._in_write = False
        # One writer connection, whose `synchronous` level is switched when a transaction needs
        # the other one. A second connection per level would save those two statements per
        # tool step but cost more: a connection's page cache is dropped whenever another
        # connection has written, and every statement would read its pages back (measured:
        # ~25 more pread calls per tool step).
        self._writer = self._connect()
        self._writer_cursor = self._writer.cursor()
        self._full_sync = True
        self._local = threading.local()
        self._readers: list[apsw.Connection] = []
        self._idle_snapshots: list[apsw.Connection] = []  # (under _readers_lock)
        self._readers_lock = threading.Lock()
        self._closed = False
        if read_only:
            try:
                self.check_schema()
                if not self._has_job_numbers():  # a copy made before migration 6, read as it is
                    self.log_sql = BY_JOB_ID
            except BaseException:
                self.close()  # (its connections, and the -wal and -shm files reading made)
                raise
        elif migrate:
            self.migrate()

    def _has_job_numbers(self) -> bool:
        """Whether the schema keeps a job's log as a range of seq (migration 6)."""
        return any(row[1] == "number" for row in self._read_rows("PRAGMA table_info(jobs)"))

    def _connect(self) -> apsw.Connection:
        # (apsw runs statements as given: no implicit transactions, BEGIN/COMMIT are ours)
        if self._uri is not None:
            flags = apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
        else:
            flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
        try:
            conn = apsw.Connection(
                self._uri or self.path, flags=flags, statementcachesize=_STATEMENT_CACHE
            )
            conn.set_busy_timeout(round(self._busy_timeout_s * 1000))
            if self._uri is None:
                conn.execute("PRAGMA journal_mode=WAL").fetchall()
                conn.execute("PRAGMA synchronous=FULL")
        except apsw.Error as exc:
            raise self._error(f"cannot open SQLite database {self.path!r}", exc) from exc
        return conn

    def _error(self, message: str, exc: BaseException) -> StoreError:
        """:func:`store_error`, with what to do when a read-only open cannot read the file."""
        error = store_error(message, exc)
        code = getattr(exc, "extendedresult", None)
        if self._uri is not None and isinstance(code, int) and code & 0xFF == _CANTOPEN:
            error.hint = (
                "Read-only, a database in WAL mode needs its -shm file or a directory this "
                "process can write. For a copy: run `PRAGMA wal_checkpoint(TRUNCATE)` on the "
                "live database, then copy the database file alone."
            )
        return error

    # --- transactions -----------------------------------------------------------------------

    def transaction(self, *, durable: bool = True) -> AbstractContextManager[SqlTransaction]:
        return _WriteTransaction(self, durable)

    @contextmanager
    def _reader(self) -> Iterator[Cursor]:
        conn: apsw.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreError("the store is closed")
            conn = self._connect()
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        cursor = conn.cursor()
        try:
            yield cast(Cursor, cursor)
        except READ_ERRORS as exc:
            raise self._error(f"SQLite read failed on {self.path!r}", exc) from exc
        finally:
            cursor.close(True)  # a statement left unfinished would hold a read transaction

    @contextmanager
    def snapshot(self, *, lenient_text: bool = False) -> Iterator[SqlSnapshot]:
        """A consistent, read-only view: a read transaction on a connection of its own while
        it lasts, so it nests with anything. The connection is one an earlier snapshot left
        idle when there is one (opening one costs ~0.3 ms, which `verify --all` pays per job);
        each snapshot begins a new transaction, so it sees what was committed before it."""
        if self._closed:
            raise StoreError("the store is closed")
        with self._readers_lock:
            conn = self._idle_snapshots.pop() if self._idle_snapshots else None
        snap: SqliteSnapshot | None = None
        try:
            if conn is None:
                conn = self._connect()
                conn.execute("PRAGMA query_only = 1")
            conn.execute("BEGIN")
            snap = SqliteSnapshot(conn, self.log_sql, lenient_text)
            snap.seal_select, snap.tlog_tables = self.seal_select, self.tlog_tables
            yield snap
        except READ_ERRORS as exc:
            raise self._error(f"SQLite read failed on {self.path!r}", exc) from exc
        finally:
            if conn is not None:
                self._snapshot_done(conn, snap)

    def _snapshot_done(self, conn: apsw.Connection, snap: SqliteSnapshot | None) -> None:
        """End a snapshot's transaction and keep its connection for the next one (a few at
        most; none once the store is closed, nor one that fails to end its transaction)."""
        try:
            if snap is not None:
                snap._end()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except apsw.Error:
            conn.close()
            return
        with self._readers_lock:
            if not self._closed and len(self._idle_snapshots) < _IDLE_SNAPSHOTS:
                self._idle_snapshots.append(conn)
                return
        conn.close()

    # --- schema -----------------------------------------------------------------------------

    def schema_version(self) -> int:
        with self._reader() as cur:
            cur.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
                (migrations.VERSION_TABLE,),
            )
            if cur.fetchone()[0] == 0:
                return 0
            cur.execute(f"SELECT coalesce(max(version), 0) FROM {migrations.VERSION_TABLE}")
            return int(cur.fetchone()[0])

    def migrate(self, on_apply: Callable[[Migration], None] | None = None) -> list[int]:
        known = migrations.load("sqlite")
        applied: list[int] = []
        # BEGIN IMMEDIATE serializes migrators across processes; DDL is transactional.
        with self.transaction() as tx:
            tx.execute(
                f"CREATE TABLE IF NOT EXISTS {migrations.VERSION_TABLE} ("
                "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            rows = tx.query(f"SELECT version FROM {migrations.VERSION_TABLE}")
            for m in migrations.pending("sqlite", (int(r[0]) for r in rows), known):
                if on_apply is not None:
                    on_apply(m)
                for statement in m.statements():
                    tx.execute(statement)
                tx.execute(
                    f"INSERT INTO {migrations.VERSION_TABLE} (version, name, applied_at) "
                    "VALUES (?, ?, ?)",
                    (m.version, m.name, utc_now()),
                )
                applied.append(m.version)
        return applied

    def clock_offset(self) -> None:
        return None  # the database is a file on this host: its workers share one clock

    def with_text_fallback(self, read: Callable[[bool], T]) -> T:
        try:
            return read(False)
        except StoreError as exc:
            if not is_text_decode_error(exc):
                raise
        # text that is not UTF-8 (a column edited outside the store) failed the strict read
        return read(True)

    def close(self) -> None:
        self._closed = True
        with self._write_lock:
            self._writer.close()
        with self._readers_lock:
            for conn in self._readers + self._idle_snapshots:
                conn.close()
            self._readers.clear()
            self._idle_snapshots.clear()
        if self._made_sidecars:
            self._made_sidecars = False
            self._remove_sidecars()

    def _remove_sidecars(self) -> None:
        """Leave no -wal and -shm files beside a database this read-only store found without
        them. Reading a WAL database makes them; SQLite removes them when the last connection
        closes, but only a connection that may write does so. So one that may write, and
        writes nothing, is opened and closed: SQLite removes the files only when no other
        connection has the database open (it must hold the exclusive lock to). A -wal file
        holding frames (a writer that came meanwhile) is left to its writer: closing would
        checkpoint them, which is a write."""
        wal = Path(self.path + "-wal")
        try:
            if not wal.exists() or wal.stat().st_size or not os.access(self.path, os.W_OK):
                return
            conn = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READWRITE)
            try:
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            finally:
                conn.close()
        except (OSError, apsw.Error):
            pass  # (a database that cannot be read: the files stay, as before)


_DML = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def _is_dml(sql: str) -> bool:
    return sql.lstrip()[:7].upper().startswith(_DML)


class RawCursor:
    """A cursor of :class:`RawConnection` (the DB-API calls tools and tests use)."""

    def __init__(self, raw: RawConnection) -> None:
        self._raw = raw
        self._cur = raw.conn.cursor()
        self._rows: Iterator[Any] = iter(())
        self.rowcount = -1

    def execute(self, sql: str, params: Sequence[Any] = ()) -> RawCursor:
        self._raw._begin_for(sql)
        self._rows = iter(self._cur.execute(sql, params))
        self.rowcount = self._raw.conn.changes() if _is_dml(sql) else -1
        return self

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> RawCursor:
        self._raw._begin_for(sql)
        changed = 0
        for row in rows:
            self._cur.execute(sql, row)
            changed += self._raw.conn.changes()
        self._rows, self.rowcount = iter(()), changed
        return self

    def fetchone(self) -> Any:
        return next(self._rows, None)

    def fetchall(self) -> list[Any]:
        return list(self._rows)

    def __iter__(self) -> Iterator[Any]:
        return self._rows

    def close(self) -> None:
        self._cur.close(True)


class RawConnection:
    """A plain connection to a store's SQLite file, for tools and tests that read or edit the
    file directly (a copy kept as evidence, a tampering test).

    It goes through the SQLite library the store itself uses: two copies of SQLite in one
    process each keep their own account of the file's POSIX locks, and one closing the file
    drops the other's — the other may then find the WAL index gone under it
    (https://sqlite.org/howtocorrupt.html, "Multiple copies of SQLite linked into the same
    application"). Python's ``sqlite3`` module is such another copy: never open a store's file
    with it in a process that has the store open.

    Like ``sqlite3`` by default, an ``INSERT``/``UPDATE``/``DELETE``/``REPLACE`` outside a
    transaction begins one (``autocommit=False``); :meth:`commit` ends it. As a context
    manager it commits (or, on an error, rolls back) and closes."""

    def __init__(self, path: str | Path, *, timeout: float = 5.0, autocommit: bool = False) -> None:
        try:
            self.conn = apsw.Connection(str(path))
        except apsw.Error as exc:
            raise store_error(f"cannot open SQLite database {str(path)!r}", exc) from exc
        self.conn.set_busy_timeout(round(timeout * 1000))
        self.autocommit = autocommit

    def _begin_for(self, sql: str) -> None:
        if not self.autocommit and not self.conn.in_transaction and _is_dml(sql):
            self.conn.execute("BEGIN")

    def cursor(self) -> RawCursor:
        return RawCursor(self)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> RawCursor:
        return RawCursor(self).execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> RawCursor:
        return RawCursor(self).executemany(sql, rows)

    def commit(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self.commit()
            else:
                self.rollback()
        finally:
            self.close()


def connect_raw(
    path: str | Path, *, timeout: float = 5.0, autocommit: bool = False
) -> RawConnection:
    """A :class:`RawConnection` to the SQLite file at ``path``."""
    return RawConnection(path, timeout=timeout, autocommit=autocommit)
