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

from affidavit.core.errors import (
    CancelRequestedError,
    StoreError,
)
from affidavit.core.events import utc_now
from affidavit.store import migrations
from affidavit.store._cancels import CANCEL_REFUSAL
from affidavit.store._snapshot import SqlSnapshot
from affidavit.store._sql import (
    BY_JOB_ID,
    Cursor,
    LogSql,
    SqlTransaction,
)
from affidavit.store._sql_store import SqlStore
from affidavit.store._sqlite_raw import (
    RawConnection as RawConnection,
)
from affidavit.store._sqlite_raw import (
    RawCursor as RawCursor,
)
from affidavit.store._sqlite_raw import (
    connect_raw as connect_raw,
)
from affidavit.store._sqlite_tx import (
    _CANTOPEN,
    BY_RANGE,
    DEFAULT_BUSY_TIMEOUT_S,
    READ_ERRORS,
    SqliteTransaction,
    TextNotUtf8,
    _all,
    _streamed,
    store_error,
)
from affidavit.store._sqlite_tx import (
    MAX_VERSION as MAX_VERSION,
)
from affidavit.store._sqlite_tx import (
    READ_ONLY_HINT as READ_ONLY_HINT,
)
from affidavit.store.base import T
from affidavit.store.migrations import Migration


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
        tx.subjects = store.subjects
        tx.subject_tables = store.subject_tables
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
            snap.retention_tables = self.retention_tables
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

    def scrub_erased(self) -> bool:
        """Checkpoint the write-ahead log into the database file and truncate it, so that the
        log keeps no copy of an erased key row (the file's copy was zeroed by the erasure).
        ``False`` when a reader still needed the log and the checkpoint could not finish."""
        with self._write_lock:
            row = self._writer_cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return row is not None and not row[0]

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
