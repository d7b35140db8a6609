"""The server backend: PostgreSQL through psycopg 3 and a connection pool.

Per-job serialization without a global lock: an append locks only its job's row
(``SELECT ... FOR UPDATE``), so appends to different jobs run in parallel and appends to one job
queue behind each other. Durability per transaction: connections run with
``synchronous_commit=on``; ``durable=False`` sets ``synchronous_commit=off`` for that transaction
only (written to the WAL, flushed by the WAL writer or by the next synchronous commit).

Our own URL parameter ``schema=NAME`` places the tables in that schema (created on migrate);
every other URL parameter goes to libpq unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from affidavit.core.errors import (
    StoreError,
    StoreUnavailable,
)
from affidavit.core.events import utc_now
from affidavit.store import migrations
from affidavit.store._pg_statements import (
    IN_KEY_ORDER,
    IN_KEY_ORDER_RESET,
    cancel_refusal,
    guard_refusal,
    ledger_row_exists,
)
from affidavit.store._pg_tx import PostgresTransaction, _Connection, _pyformat
from affidavit.store._pg_url import (
    connect_may_pass,
    store_error,
)
from affidavit.store._pg_url import (
    pool_size_of as pool_size_of,
)
from affidavit.store._pg_url import (
    pool_timeout_of as pool_timeout_of,
)
from affidavit.store._pg_url import (
    prepare_of as prepare_of,
)
from affidavit.store._pg_url import (
    redact as redact,
)
from affidavit.store._pg_url import (
    split_url as split_url,
)
from affidavit.store._snapshot import SqlSnapshot
from affidavit.store._sql import (
    Cursor,
    SqlTransaction,
)
from affidavit.store._sql_store import SqlStore
from affidavit.store.base import (
    ClockOffset,
)
from affidavit.store.migrations import Migration

log = logging.getLogger("affidavit.store")

_MIGRATION_LOCK = 0x6166666964  # "affid": serializes concurrent migrators (of one schema)
# How long the server lets a session sit idle inside a transaction before it ends the session
# (rolling back, releasing its locks). A write transaction of the store holds no user code, so
# a session idle that long belongs to a process that was frozen or cut off while it held a
# job's row lock: the lease alone would not free the job, since a claim skips a locked row.
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_S = 10.0


def migration_lock(schema: str | None) -> int:
    """The advisory lock that serializes the migrators of ``schema``: the tables of one schema
    are migrated by one process at a time, and the migrators of other schemas on the same
    server (every object a migration makes is in its schema) do not wait for each other."""
    if schema is None or schema == "public":  # (the default search path's schema)
        return _MIGRATION_LOCK
    digest = hashlib.blake2b(schema.encode(), digest_size=8, person=b"affid-migrate").digest()
    return int.from_bytes(digest, "big", signed=True)


# libpq's chunked-rows mode (libpq 17, which psycopg[binary] bundles); with an older libpq the
# snapshots stream through server-side cursors
CHUNKED_ROWS = psycopg.pq.version() >= 170000
_cursor_names = itertools.count()
# Every pooled connection runs with JIT compilation off. The store's statements are short: a
# plan whose estimated cost passes jit_above_cost (a statement that must sort anyway while
# sorting is disabled — the signing keys by creation — carries the planner's penalty in its
# cost) was compiled with LLVM, ~20 ms for a statement that runs in well under one.
SESSION_SETTINGS = "SET synchronous_commit = on; SET jit = off"
CLOCK_SELECT = "SELECT extract(epoch FROM clock_timestamp())"
CLOCK_READINGS = 3


class _KeyOrderReads:
    """A cursor for reads planned with :data:`IN_KEY_ORDER`, at no cost in round trips: the
    setting and the statement travel as one simple query, which PostgreSQL runs as one implicit
    transaction (``SET LOCAL`` holds for the statement and ends with it); psycopg binds the
    parameters on the client (``ClientCursor``: quoted by libpq)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._cursor = psycopg.ClientCursor(conn)

    def execute(self, sql: Any, params: Any = None, /) -> Any:
        self._cursor.execute(f"{IN_KEY_ORDER}; {sql}", params)
        self._cursor.nextset()  # (the first result is the setting's)
        return self

    def executemany(self, sql: Any, params: Any, /) -> Any:
        raise TypeError("a reader's cursor does not write")

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()


class PostgresSnapshot(SqlSnapshot):
    """Reads inside one ``REPEATABLE READ READ ONLY`` transaction. A stream is one query whose
    rows arrive in chunks of ``batch`` (libpq's chunked-rows mode: no round trip per chunk,
    and none to open or close a cursor, as a server-side cursor has), read to its end before
    the snapshot's next read: the connection carries one statement at a time. (Without that
    mode, a server-side cursor fetching ``batch`` rows per round trip.)"""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._streams: list[Generator[Sequence[Any], None, None]] = []
        self._reading: Iterator[Sequence[Any]] | None = None  # a stream begun, not finished
        self._in_key_order = True  # IN_KEY_ORDER holds (see stream_in_key_order)

    def _end(self) -> None:
        """Close the streams the caller left unfinished (psycopg cancels the statement and
        drains what arrived), so that the snapshot's ROLLBACK can run."""
        for rows in self._streams:
            rows.close()
        self._streams.clear()

    def _check_idle(self) -> None:
        if self._reading is not None:
            # (psycopg would wait for the connection's lock, which the unfinished stream holds)
            raise StoreError(
                "a snapshot read began before the snapshot's stream was read to its end"
            )

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self._check_idle()
        return self._conn.execute(_pyformat(sql), params or None).fetchall()

    def stream(self, sql: str, params: Sequence[Any], batch: int) -> Iterator[Sequence[Any]]:
        rows = self._stream(sql, params, batch)
        self._streams.append(rows)
        return rows

    # A snapshot begins planning in key order (IN_KEY_ORDER goes with its BEGIN: no round trip
    # for verifying a job, whose other reads look rows up by key); a listing of jobs sets the
    # planner back first (a listing with two statuses has no index in its order: a sort of the
    # few jobs that match beats walking every job), and a log read after it sets it again.

    def stream_in_key_order(
        self, sql: str, params: Sequence[Any], batch: int
    ) -> Iterator[Sequence[Any]]:
        if not self._in_key_order:
            self._check_idle()
            self._conn.execute(IN_KEY_ORDER)
            self._in_key_order = True
        return self.stream(sql, params, batch)

    def plan_freely(self) -> None:
        if self._in_key_order:
            self._check_idle()
            self._conn.execute(IN_KEY_ORDER_RESET)
            self._in_key_order = False

    def _stream(
        self, sql: str, params: Sequence[Any], batch: int
    ) -> Generator[Sequence[Any], None, None]:
        self._check_idle()
        if not CHUNKED_ROWS:
            with self._conn.cursor(name=f"affidavit_snapshot_{next(_cursor_names)}") as cursor:
                cursor.itersize = batch
                cursor.execute(_pyformat(sql), params)
                yield from cursor
            return
        rows = cast(
            "Generator[Sequence[Any], None, None]",
            self._conn.cursor().stream(_pyformat(sql), params, size=max(batch, 1)),
        )
        self._reading = rows
        try:
            yield from rows
        finally:
            self._reading = None
            rows.close()


#: The longest one step of :meth:`PostgresStore.scrub_erased` may take, in seconds.
SCRUB_TIMEOUT = 60


class PostgresStore(SqlStore):
    """A :class:`~affidavit.store.base.Store` on a PostgreSQL database."""

    backend = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int | None = None,
        connect_timeout_s: float = 10.0,
        migrate: bool = True,
        read_only: bool = False,
        idle_in_transaction_timeout_s: float = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT_S,
    ) -> None:
        self.url = url
        # 0: no bound; a bound set for the role or database, or in the URL
        # (options=-c idle_in_transaction_session_timeout=...), is kept as it is
        self._idle_timeout_ms = max(0, round(idle_in_transaction_timeout_s * 1000))
        # read-only: nothing is migrated, and every session refuses writes
        # (default_transaction_read_only), so a role with SELECT rights alone can read
        self.read_only = read_only
        conninfo, self.schema = split_url(url)
        # (the URL's pool_size, else 10; checked before anything connects)
        self.pool_size = max_size if max_size is not None else pool_size_of(url)
        self.pool_timeout = pool_timeout_of(url)
        self.prepare = prepare_of(url)
        # One direct connection first: it fails fast with libpq's own reason (refused, bad
        # password, no such database), where a pool would keep retrying until its timeout.
        try:
            psycopg.connect(conninfo, connect_timeout=max(1, int(connect_timeout_s))).close()
        except psycopg.Error as exc:
            # every line of libpq's message: the cause ("Connection refused") is on one, its
            # advice (an indented "Is the server running ...?") on the next
            reason = " ".join(x.strip() for x in str(exc).splitlines() if x.strip())
            reason = reason or type(exc).__name__
            # a server that is down, starting or shutting down may be back soon (a worker
            # waits for it); a refused login or a missing database is not
            kind = StoreUnavailable if connect_may_pass(exc) else StoreError
            raise kind(
                f"cannot connect to PostgreSQL at {redact(url)}: {redact(reason)}",
                hint="Check that the server is running and the URL (user, host, port, database, "
                "password with special characters %-encoded) is right.",
            ) from None
        self._pool = ConnectionPool(
            conninfo,
            connection_class=_Connection,
            min_size=min(min_size, self.pool_size),
            max_size=self.pool_size,
            timeout=self.pool_timeout,
            # psycopg prepares nothing itself: it would also drop every prepared statement of
            # the session (DEALLOCATE ALL) after a rollback, the store's own included
            kwargs={"autocommit": True, "prepare_threshold": None},
            configure=self._configure,
            open=False,
            name="affidavit",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except (PoolTimeout, psycopg.Error) as exc:
            self._pool.close()
            # (the server went away since the direct connection, or has no connection slot
            # free for now: both may pass)
            raise StoreUnavailable(
                f"cannot open a connection pool to PostgreSQL at {redact(url)}",
                hint="Check the server's max_connections and the URL.",
            ) from exc
        try:
            if read_only:
                self.check_schema()
            elif migrate:
                self.migrate()
        except BaseException:
            self._pool.close()  # (no pool thread outlives a store that was never returned)
            raise

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        # one message, one round trip (a new connection of the pool is configured before use)
        settings = [SESSION_SETTINGS]
        if self._idle_timeout_ms:  # (unless the role, the database or the URL set one)
            settings.append(
                "SELECT set_config('idle_in_transaction_session_timeout', "
                f"'{self._idle_timeout_ms}', false) "
                "WHERE current_setting('idle_in_transaction_session_timeout') = '0'"
            )
        if self.read_only:
            settings.append("SET default_transaction_read_only = on")
        if self.schema:
            path = sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema))
            settings.append(path.as_string(conn))
        psycopg.ClientCursor(conn).execute("; ".join(settings))

    def _q(self, query: str) -> str:
        return _pyformat(query)

    def _failed(self, message: str, exc: psycopg.Error) -> StoreError:
        """:func:`store_error`, after checking the other connections idle in the pool when
        this one failed at the connection level: a server restart or failover ends every
        session at once, and each connection the pool still held would otherwise fail the
        next operation that got it, long after the server is back."""
        if isinstance(exc, psycopg.OperationalError) and not isinstance(exc, PoolClosed):
            # the broken ones are replaced by new connections; a check that fails tells the
            # caller nothing more than the error below
            with contextlib.suppress(psycopg.Error, PoolTimeout):
                self._pool.check()
        return store_error(message, exc)

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[SqlTransaction]:
        try:
            # (getconn/putconn rather than the pool's context manager, whose commit of the
            # connection at the end has nothing to do here: the transaction sends its own)
            conn = self._pool.getconn()
            try:
                tx = PostgresTransaction(conn, durable=durable, prepare=self.prepare)
                tx.trust_tables = self.trust_tables
                tx.subjects = self.subjects
                tx.subject_tables = self.subject_tables
                yield tx
                tx.commit()
            except BaseException:
                # Nothing was sent yet (IDLE), or the transaction is open or refused: it is
                # rolled back; a connection that cannot even do that is not given back (the
                # pool opens a new one, and the transaction ends with it).
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    try:
                        conn.execute("ROLLBACK")
                    except psycopg.Error:
                        conn.close()
                raise
            finally:
                self._pool.putconn(conn)
        except psycopg.Error as exc:
            refused = guard_refusal(exc) or ledger_row_exists(exc) or cancel_refusal(exc)
            if refused is not None:  # a write fenced off, or a log that moved: nothing written
                raise refused from None
            raise self._failed("PostgreSQL write failed", exc) from exc
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no PostgreSQL connection available: {exc}") from exc

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for reads; what fails while it is held, as the store's errors."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise self._failed("PostgreSQL read failed", exc) from exc
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no PostgreSQL connection available: {exc}") from exc

    @contextmanager
    def _reader(self) -> Iterator[Cursor]:
        with self._connection() as conn:
            yield conn.cursor()

    @contextmanager
    def _log_reader(self) -> Iterator[Cursor]:
        """A cursor whose reads are planned with :data:`IN_KEY_ORDER` (see
        :class:`_KeyOrderReads`)."""
        with self._connection() as conn:
            yield _KeyOrderReads(conn)

    @contextmanager
    def snapshot(self, *, lenient_text: bool = False) -> Iterator[SqlSnapshot]:
        """A consistent, read-only view of the database as of its first read. (PostgreSQL
        keeps text valid in the database's encoding: ``lenient_text`` changes nothing.)"""
        del lenient_text
        with self._connection() as conn:
            # (one round trip) a reader may work between its reads for long (a large log); it
            # holds no row lock, so nothing waits for it
            conn.execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
                f"SET LOCAL idle_in_transaction_session_timeout = 0; {IN_KEY_ORDER}"
            )
            snap = PostgresSnapshot(conn)
            snap.seal_select, snap.tlog_tables = self.seal_select, self.tlog_tables
            snap.retention_tables = self.retention_tables
            try:
                yield snap
            finally:
                snap._end()
                conn.execute("ROLLBACK")

    # --- schema -----------------------------------------------------------------------------

    def schema_version(self) -> int:
        with self._reader() as cur:
            cur.execute("SELECT to_regclass(%s)", (migrations.VERSION_TABLE,))
            if cur.fetchone()[0] is None:
                return 0
            cur.execute(f"SELECT coalesce(max(version), 0) FROM {migrations.VERSION_TABLE}")
            return int(cur.fetchone()[0])

    def migrate(self, on_apply: Callable[[Migration], None] | None = None) -> list[int]:
        known = migrations.load("postgres")
        applied: list[int] = []
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (migration_lock(self.schema),))
                if self.schema:
                    conn.execute(
                        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                            sql.Identifier(self.schema)
                        )
                    )
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {migrations.VERSION_TABLE} ("
                    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
                )
                rows = conn.execute(f"SELECT version FROM {migrations.VERSION_TABLE}").fetchall()
                for m in migrations.pending("postgres", (int(r[0]) for r in rows), known):
                    if on_apply is not None:
                        on_apply(m)
                    for statement in m.statements():
                        conn.execute(statement.encode())
                    conn.execute(
                        f"INSERT INTO {migrations.VERSION_TABLE} (version, name, applied_at) "
                        "VALUES (%s, %s, %s)",
                        (m.version, m.name, utc_now()),
                    )
                    applied.append(m.version)
        except psycopg.Error as exc:
            # (a connection lost mid-migration rolled it back: it may be applied again)
            raise store_error("PostgreSQL migration failed", exc) from exc
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no PostgreSQL connection available: {exc}") from exc
        return applied

    def clock_offset(self) -> ClockOffset:
        """The server's clock (``clock_timestamp()``) against this host's, read three times;
        the reading with the shortest round trip is kept."""
        best: ClockOffset | None = None
        with self._connection() as conn:
            for _ in range(CLOCK_READINGS):
                sent = time.time()
                row = conn.execute(CLOCK_SELECT, prepare=False).fetchone()
                received = time.time()
                half = (received - sent) / 2
                if row is not None and (best is None or half < best.uncertainty):
                    best = ClockOffset(float(row[0]) - (sent + half), half)
        assert best is not None  # (the statement returns one row)
        return best

    def scrub_erased(self) -> bool:
        """Rewrite ``subject_keys`` into new files (``VACUUM FULL``: the old files, which still
        hold the erased key row's dead tuple, are emptied and unlinked), then checkpoint and
        switch the write-ahead log so that the segments that hold the row's insert are retired
        (removed with ``wal_recycle = off``; else recycled, and overwritten as they are
        reused). Each step is bounded (:data:`SCRUB_TIMEOUT`); ``False`` when one could not be
        done — a lock held too long, a slow checkpoint, or a role that may not checkpoint or
        switch the log (superuser or ``pg_checkpoint``): running the erasure again retries
        (docs/privacy.md)."""
        bounded = f"SET statement_timeout = '{SCRUB_TIMEOUT}s'"
        try:
            with self._pool.connection() as conn:
                conn.execute(bounded)
                try:
                    conn.execute(f"SET lock_timeout = '{SCRUB_TIMEOUT}s'")
                    conn.execute("VACUUM FULL subject_keys")
                    conn.execute("CHECKPOINT")
                    conn.execute("SELECT pg_switch_wal()")
                    conn.execute("CHECKPOINT")
                finally:
                    conn.execute("RESET statement_timeout")
                    conn.execute("RESET lock_timeout")
        except (psycopg.Error, PoolTimeout):
            return False
        return True

    def close(self) -> None:
        self._pool.close()
