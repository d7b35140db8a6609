"""The SQLite backend's transaction: a job's log as one range of the events table's rowid
(see :mod:`affidavit.store.sqlite`), the append guard and the chained inserts, and how an error
of the driver becomes the store's."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, cast

import apsw

from affidavit.core.chain import chain_next
from affidavit.core.errors import (
    JobNotFound,
    StoreError,
    StoreUnavailable,
)
from affidavit.core.events import utc_now
from affidavit.store._sql import (
    EVENT_COLUMNS,
    LogSql,
    SqlTransaction,
    job_row_select,
)
from affidavit.store._sql_rows import (
    FULL_DISK_HINT,
    conflict,
    fenced,
)
from affidavit.store.base import Encoded, StoredEvent

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


_REBUILD_SUBJECT_KEYS = (
    "CREATE TABLE subject_keys_kept (subject_id TEXT PRIMARY KEY, wrapped_key BLOB NOT NULL)",
    "INSERT INTO subject_keys_kept SELECT subject_id, wrapped_key FROM subject_keys",
    "DROP TABLE subject_keys",
    "ALTER TABLE subject_keys_kept RENAME TO subject_keys",
)


class SqliteTransaction(SqlTransaction):
    """Statements run at once on the writer connection, through its one cursor (a cursor per
    statement costs more than the statement's own bookkeeping). No row locks are needed:
    ``BEGIN IMMEDIATE`` already holds the database write lock."""

    # A job's events are the rows of its range of the table's rowid (``number << 32``).
    EVENTS_BY_JOB_RANGE = True

    log_sql = BY_RANGE

    def __init__(self, conn: apsw.Connection, cursor: apsw.Cursor) -> None:
        self._conn = conn
        self._cur = cursor

    def erase_subject(
        self, subject_id: str, *, at: str, reason: str | None, receipt: str, leaf: bytes
    ) -> None:
        """:meth:`SubjectOps.erase_subject`, with ``secure_delete`` on: the key row's bytes
        are overwritten with zeros, and the table is rebuilt so that no page it ever used keeps
        a copy (its old pages are freed, which zeroes them too). What the write-ahead log still
        holds is removed by :meth:`SqliteStore.scrub_erased` after the commit."""
        self._cur.execute("PRAGMA secure_delete = ON")
        try:
            super().erase_subject(subject_id, at=at, reason=reason, receipt=receipt, leaf=leaf)
            for statement in _REBUILD_SUBJECT_KEYS:
                self._cur.execute(statement)
        finally:
            self._cur.execute("PRAGMA secure_delete = OFF")

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
