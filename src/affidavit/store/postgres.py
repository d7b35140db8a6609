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
import functools
import hashlib
import itertools
import json
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, cast
from urllib.parse import parse_qsl, quote, urlencode

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from affidavit.core.errors import (
    AffidavitError,
    CancelRequestedError,
    ConfigError,
    JobNotFound,
    LedgerRowExists,
    StoreError,
    StoreUnavailable,
)
from affidavit.core.events import utc_now
from affidavit.store import migrations
from affidavit.store._ledger import (
    LEDGER_FINISH,
    LEDGER_INSERT_NEW,
    claimed_from_row,
    runnable_jobs,
)
from affidavit.store._seals import KEY_INSERT, LEAF_QUEUE_INSERT, SEAL_INSERT
from affidavit.store._snapshot import SqlSnapshot
from affidavit.store._sql import (
    EVENT_COLUMNS,
    EVENT_INSERT,
    FULL_DISK_HINT,
    HEAD_SELECT,
    LOCK_JOB,
    STATUS_UPDATE_FENCED,
    Cursor,
    SqlStore,
    SqlTransaction,
    conflict,
    event_from_row,
    fenced,
    head_moved,
    job_from_row,
)
from affidavit.store.base import (
    Claimed,
    ClockOffset,
    Encoded,
    JobRecord,
    NextClaim,
    StoredEvent,
)
from affidavit.store.migrations import Migration

log = logging.getLogger("affidavit.store")

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_DIGITS = re.compile(r"[0-9]{1,6}")
_MIGRATION_LOCK = 0x6166666964  # "affid": serializes concurrent migrators (of one schema)
_KEY_REGISTRY_LOCK = 0x6166666B6579  # "affkey": serializes registrations of the first seal key
_DISK_FULL = "53100"  # SQLSTATE disk_full: "could not extend file ... No space left on device"
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


@functools.lru_cache(maxsize=512)
def _pyformat(query: str) -> str:
    """``?`` placeholders (the shared SQL) to psycopg's ``%s``."""
    return query.replace("?", "%s")


class _Connection(psycopg.Connection[Any]):
    """A connection of the store's pool: it knows the names of the statements it has
    prepared (see :meth:`PostgresTransaction._executed`), which live as long as its session,
    and keeps the one cursor its write transactions send through (one at a time)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prepared: set[str] = set()
        self._writes: psycopg.ClientCursor[Any] | None = None

    def writes(self) -> psycopg.ClientCursor[Any]:
        if self._writes is None:
            self._writes = psycopg.ClientCursor(self)
        return self._writes


class PostgresTransaction(SqlTransaction):
    """Sends its statements in as few round trips as the reads allow: writes are queued, bound
    on the client, and travel as one message (the simple-query protocol, several statements
    separated by semicolons) with the next read or the commit. ``BEGIN`` is the first statement
    of the first message, so a transaction that only writes — T2 of a tool step, or T1 when its
    ledger insert is presumed new — is one round trip and one message. An append reads the
    job's lock and head in one round trip, then its inserts go with the commit, whatever the
    number of events; an append whose writer knows the head (a run's) is checked on the server
    instead, in the message that carries it, and costs no round trip of its own
    (:meth:`_append_after_head`). T1 with an insert that may meet its row is two round trips:
    the insert travels with the append's lock and head read (:meth:`inserted_before_append`).

    Values are bound on the client: the common types as literals written by :func:`_literal`
    (psycopg's quoting rules), any other through psycopg's :class:`~psycopg.ClientCursor`.
    That costs a fraction of the per-statement overhead of the extended protocol's
    bind/execute messages: a tool step's two transactions take less than half the client CPU
    time they took in psycopg's pipeline mode with prepared statements. The statements of a
    claim, a tool step and a job's end (:data:`_PREPARED_STATEMENTS`) are prepared on the
    server all the same: once per connection, with ``PREPARE`` (a round trip of its own, the
    first time the connection sends one), then sent as ``EXECUTE name(literals)`` in the
    messages above, so the server parses and plans each once per connection instead of once
    per message (:meth:`_executed`)."""

    FOR_UPDATE = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    key_registry_lock = f"SELECT pg_advisory_xact_lock({_KEY_REGISTRY_LOCK})"

    def __init__(self, conn: _Connection, *, durable: bool, prepare: bool = True) -> None:
        self._cursor = conn.writes()
        # the names this connection has prepared; None: it prepares nothing (prepare_of)
        self._prepared = conn.prepared if prepare else None
        # statements not sent yet: they open the next message
        self._pending: list[str] = ["BEGIN"]
        if not durable:
            self._pending.append("SET LOCAL synchronous_commit = off")
        # (job id, lock row, head row) read with a ledger insert, for the append that follows;
        # dropped by any other statement, which could be a write that moves the head
        self._locked: tuple[str, Any, Any] | None = None
        # whether a message of this transaction (its BEGIN) has been sent
        self._begun = False
        # the next read carries the commit (commit_with_next_read); then it has been sent
        self._commit_with_read = False
        self._committed = False
        # a claim sent with the commit (claim_after_commit)
        self._after_commit: NextClaim | None = None

    def _bound(self, sql: str, params: Sequence[Any]) -> str:
        if not params:
            return sql
        literals = [_literal(value) for value in params]
        if None in literals:  # a value of another type: psycopg quotes them all
            return self._cursor.mogrify(_pyformat(sql), params)
        if self._prepared is not None and sql in _PREPARED_STATEMENTS:
            return self._executed(sql, 1, cast(list[str], literals))
        return _pyformat(sql) % tuple(literals)

    def _executed(self, sql: str, rows: int, literals: list[str]) -> str:
        """``EXECUTE`` of ``sql`` (with ``rows`` rows, for an ``INSERT ... VALUES``) with
        ``literals`` for its parameters; prepared first if this connection has not prepared
        it yet. The ``PREPARE`` is a round trip of its own, sent now (before what is queued;
        prepared statements are not transactional), and counted as done only once the server
        has answered it, so a connection's set of names is never ahead of the server's."""
        name = _statement_name(sql, rows)
        prepared = cast(set[str], self._prepared)
        if name not in prepared:
            self._cursor.execute(f"PREPARE {name} AS {_numbered(sql, rows)}")
            prepared.add(name)
        return f"EXECUTE {name}({', '.join(literals)})" if literals else f"EXECUTE {name}"

    def _send(self, reads: Sequence[str]) -> list[list[Any]]:
        """One round trip: the queued statements, then ``reads`` (then the commit, if it goes
        with them: :meth:`commit_with_next_read`); the rows of each read."""
        if self._committed:
            raise RuntimeError("a statement after the transaction's commit")
        statements = [*self._pending, *reads]
        self._pending = []
        self._begun = True
        if self._commit_with_read:
            statements.append("COMMIT")
            self._committed = True
        cursor = self._cursor
        cursor.execute(";\n".join(statements))
        # the reads' results are the last ones (before the commit's)
        results = _results(cursor)
        end = len(results) - self._committed
        return results[end - len(reads) : end]

    def commit_with_next_read(self) -> None:
        """Send the commit with the next read, in its round trip: for a transaction whose last
        statement is a read (a claim). Nothing may follow that read."""
        self._commit_with_read = True

    def commit(self) -> None:
        """The queued statements and the commit, in one round trip (none if a read carried the
        commit already); a claim to make after it (:meth:`claim_after_commit`) goes in the
        same message."""
        if self._committed:
            if self._pending:
                raise RuntimeError("a statement after the transaction's commit")
            return
        statements = [*self._pending, "COMMIT"]
        self._pending = []
        if self._after_commit is None:
            self._cursor.execute(";\n".join(statements))
        else:
            self._commit_and_claim(statements, self._after_commit)

    def claim_after_commit(self, request: NextClaim) -> None:
        if not request.sent:
            self._after_commit = request

    def _commit_and_claim(self, statements: list[str], request: NextClaim) -> None:
        """``statements`` (ending with the commit), then ``request``'s claim in a transaction
        of its own (not waited to disk, as :meth:`SqlStore.claim`'s), in one message. The
        server runs the claim only if the commit succeeded (an error skips the rest of a
        message). A failure leaves it to be told which part failed: the transaction notes a
        session setting (``affidavit.committed``, this claim's attempt id) before its commit,
        which stays only if the commit did — an error in the claim alone leaves the commit as
        it was, and the claim unmade (the claimer claims the usual way)."""
        request.sent = True
        cursor = self._cursor
        # The claim's statements are prepared (their PREPARE a round trip of its own) only
        # while this transaction has sent nothing: a PREPARE the server refused inside it
        # would abort it. Then a refused one costs the claim alone; afterwards, what is not
        # prepared yet goes as text.
        prepared = self._prepared
        if self._begun:
            self._prepared = None
        try:
            reads = self._claim_reads(
                request.owner,
                request.attempt_id,
                request.now,
                request.lease_seconds,
                None,
                request.skip,
                request.with_log,
            )
        except psycopg.Error as exc:
            log.warning("a claim to send after a commit could not be prepared: %s", exc)
            cursor.execute(";\n".join(statements))
            return
        finally:
            self._prepared = prepared
        nonce = _literal(request.attempt_id)
        try:
            cursor.execute(
                ";\n".join(
                    [
                        *statements[:-1],
                        f"SELECT set_config('affidavit.committed', {nonce}, false)",
                        "COMMIT",
                        "BEGIN",
                        "SET LOCAL synchronous_commit = off",
                        *reads,
                        "COMMIT",
                    ]
                )
            )
        except psycopg.Error as exc:
            conn = cursor.connection
            status = conn.info.transaction_status
            if status == psycopg.pq.TransactionStatus.INERROR:
                conn.execute("ROLLBACK")
            elif status != psycopg.pq.TransactionStatus.IDLE:
                raise  # the connection is lost: whether the commit landed is unknown
            row = conn.execute("SELECT current_setting('affidavit.committed', true)").fetchone()
            if row is None or row[0] != request.attempt_id:
                raise  # the transaction failed: the claim never ran
            log.warning("a claim sent after a commit failed (the claimer claims again): %s", exc)
            return
        results = _results(cursor)
        request.claimed = _claimed(results[-1 - len(reads) : -1])
        request.made = True

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._locked = None
        self._pending.append(self._bound(sql, params))

    def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._locked = None
        bound = self._bound
        values = _single_row_values(sql)
        if values is None:
            self._pending.extend(bound(sql, row) for row in rows)
        elif rows:  # one INSERT of every row: one statement for the server to parse and plan
            prepared = self._prepared is not None and sql in _PREPARED_STATEMENTS
            if prepared and len(rows) <= _PREPARED_ROWS_MAX:
                literals = [_literal(value) for row in rows for value in row]
                if None not in literals:
                    executed = self._executed(sql, len(rows), cast(list[str], literals))
                    self._pending.append(executed)
                    return
            head = sql[: len(sql) - len(values)]
            self._pending.append(head + ", ".join(bound(values, row) for row in rows))

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self._locked = None
        (rows,) = self._send([self._bound(sql, params)])
        return rows

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
        self._locked = None
        reads = self._claim_reads(owner, attempt_id, now, lease_seconds, job_id, skip, with_log)
        return _claimed(self._send(reads))

    def _claim_reads(
        self,
        owner: str,
        attempt_id: str,
        now: float,
        lease_seconds: float,
        job_id: str | None,
        skip: Collection[str],
        with_log: bool,
    ) -> list[str]:
        """A claim's statements, read in one round trip (see :func:`_claimed`).

        One statement claims: the first runnable job is locked (skipping rows other claimers
        hold) and leased, and returned as it was before (claimed_from_row); a recovery keeps
        its count, any other claim starts it again. The statement also notes the job's id for
        the rest of the transaction, where the log read that may follow it in the message
        finds it: a statement of its own, so it sees everything committed before the claim
        took the job's lock (and nobody appends while the claim holds it)."""
        candidates, params = runnable_jobs(now, job_id, skip)
        statement = self._bound(
            _claim_statement(candidates),
            [*params, attempt_id, owner, now + lease_seconds, utc_now()],
        )
        if not with_log:
            return [statement]
        read_log = (
            self._executed(_CLAIMED_LOG, 1, []) if self._prepared is not None else _CLAIMED_LOG
        )
        return [statement, IN_KEY_ORDER, read_log]

    def list_events(self, job_id: str) -> list[StoredEvent]:
        # in key order (see IN_KEY_ORDER); the settings travel with the read, no round trip
        self.execute(IN_KEY_ORDER)
        events = super().list_events(job_id)
        self.execute(IN_KEY_ORDER_RESET)
        return events

    def get_job(self, job_id: str, *, for_update: bool = False) -> JobRecord | None:
        if not for_update:
            return super().get_job(job_id, for_update=False)
        # One round trip: the row lock, then (a statement of its own, so it sees what the lock's
        # previous holder committed) the row itself.
        self._locked = None
        _, read = self._send(
            [
                self._bound(LOCK_JOB, (job_id,)),
                self._bound(f"{self.log_sql.job_select} WHERE j.job_id = ?", (job_id,)),
            ]
        )
        return job_from_row(read[0]) if read else None

    def inserted_before_append(self, sql: str, params: Sequence[Any], job_id: str) -> bool:
        # One round trip: the insert, then the job's lock and head read exactly as
        # _lock_and_head sends them (in this order, as when the append sends them itself).
        inserted, lock, head = self._send(
            [self._bound(sql + " RETURNING 1", params), *self._lock_and_head_reads(job_id)]
        )
        self._locked = (job_id, _first(lock), _first(head))
        return bool(inserted)

    SENDS_PRESUMED_NEW = True

    def send_presumed_new(self, sql: str, params: Sequence[Any]) -> None:
        # Queued: the append after it is checked on the server (see _append_after_head) and
        # everything travels with the commit — T1 in one round trip. A row already there is a
        # unique violation that aborts the transaction at its commit (see ledger_row_exists).
        self.execute(sql, params)

    def _lock_and_head(self, job_id: str) -> tuple[Any, Any]:
        locked, self._locked = self._locked, None
        if locked is not None and locked[0] == job_id:  # read with the ledger insert just now
            return locked[1], locked[2]
        lock, head = self._send(self._lock_and_head_reads(job_id))
        return _first(lock), _first(head)

    def _append_after_head(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        expected_version: int,
        fence: str | None,
        head: bytes,
    ) -> list[StoredEvent]:
        locked = self._locked
        if locked is not None and locked[0] == job_id:  # (T1: read with the ledger insert)
            return super()._append_after_head(job_id, encoded, expected_version, fence, head)
        # No round trip of its own: the server locks the job and checks the fence, the version
        # and the head (affidavit_append_guard, migration 9) in the message that carries the
        # inserts and the commit. A failed check aborts the transaction and skips the rest of
        # the message; it surfaces at the transaction's next round trip (a read, or the commit)
        # as the error the check here would raise (see guard_refusal).
        self.execute(_APPEND_GUARD, (job_id, fence, expected_version, head.hex() or None))
        return self._insert_chained(job_id, expected_version, head, encoded)

    def _lock_and_head_reads(self, job_id: str) -> list[str]:
        # Two statements, one round trip: the head read starts after the lock is granted, so
        # under READ COMMITTED its snapshot includes what the previous holder committed.
        return [self._bound(LOCK_JOB, (job_id,)), self._bound(HEAD_SELECT, (job_id,))]


_RECOVERY = "c.status = 'running' AND c.lease_owner IS NOT NULL"  # (as claimed_from_row)
_CLAIM_UPDATE = (
    "UPDATE jobs SET status = 'running', attempt_id = ?, lease_owner = ?, lease_expires_at = ?, "
    f"updated_at = ?, recoveries = CASE WHEN {_RECOVERY} THEN c.recoveries ELSE 0 END, "
    f"recovery_progress = CASE WHEN {_RECOVERY} THEN c.recovery_progress END "
    "FROM c WHERE jobs.job_id = c.job_id "
    "RETURNING c.job_id, c.status, c.lease_owner, c.recoveries, c.recovery_progress, "
    "set_config('affidavit.claimed', c.job_id, true)"
)
# The log of the job the claim before it in the transaction took (see claim)
_CLAIMED_LOG = (
    f"SELECT {EVENT_COLUMNS} FROM events "
    "WHERE job_id = current_setting('affidavit.claimed', true) ORDER BY version"
)


def _results(cursor: psycopg.ClientCursor[Any]) -> list[list[Any]]:
    """The rows of each statement of the message ``cursor`` sent last, in order (none for a
    statement that returns no rows)."""
    results: list[list[Any]] = []
    while True:
        results.append(cursor.fetchall() if cursor.description is not None else [])
        if not cursor.nextset():
            return results


def _claimed(results: list[list[Any]]) -> Claimed | None:
    """The job the reads of :meth:`PostgresTransaction._claim_reads` took (their results, in
    order), with its log when they read it; ``None`` if nothing was runnable."""
    rows = results[0]
    if not rows:
        return None
    claimed = claimed_from_row(rows[0][:5])
    if len(results) == 1:
        return claimed
    return replace(claimed, log=tuple(event_from_row(row) for row in results[2]))


def _claim_statement(candidates: str) -> str:
    return f"WITH c AS ({candidates}{PostgresTransaction.SKIP_LOCKED}) {_CLAIM_UPDATE}"


def _literal(value: Any) -> str | None:
    """``value`` as an SQL literal, exactly as psycopg's client-side binding writes it, for the
    types the store's statements bind most (text, integers, finite floats, bytes, booleans,
    NULL); ``None`` for any other value (and for text holding NUL, which PostgreSQL refuses,
    and for an infinite or NaN float): psycopg binds the statement then. A tool step binds
    about forty values; this is several times faster than going through psycopg's adapters
    for each.

    Text is quoted by doubling its quotes; text holding a backslash is written as an escape
    string (``E'...'``) with the backslashes doubled too, and bytes as an escape string of
    their hex form, so what the server reads does not depend on
    ``standard_conforming_strings``. A negative number is written after a space, as
    psycopg does, so that no ``-`` before it can make a comment."""
    kind = type(value)
    if kind is str:
        text: str = value
        if "\x00" in text:
            return None
        quoted = text.replace("'", "''")
        if "\\" in text:
            return "E'" + quoted.replace("\\", "\\\\") + "'"
        return "'" + quoted + "'"
    if kind is int:
        number: int = value
        return str(number) if number >= 0 else f" {number}"
    if kind is float:
        real: float = value
        if not math.isfinite(real):
            return None
        written = repr(real)
        return " " + written if written.startswith("-") else written  # (-0.0 too)
    if kind is bytes:
        data: bytes = value
        return "E'\\\\x" + data.hex() + "'::bytea"
    if value is None:
        return "NULL"
    if kind is bool:
        return "true" if value else "false"
    return None


_VALUES_TAIL = re.compile(r"\bVALUES (\([?, ]+\))\Z")


@functools.lru_cache(maxsize=64)
def _single_row_values(sql: str) -> str | None:
    """The ``(?, ...)`` row of an ``INSERT ... VALUES (?, ...)`` that ends there (nothing after
    it: no ``ON CONFLICT``, no ``RETURNING``), which more rows may follow; else ``None``."""
    if not sql.startswith("INSERT INTO "):
        return None
    found = _VALUES_TAIL.search(sql)
    return found.group(1) if found else None


def _first(rows: list[Any]) -> Any:
    return rows[0] if rows else None


_APPEND_GUARD = "SELECT affidavit_append_guard(?, ?, ?::bigint, ?)"

# The statements sent per claim, per tool step (T1 and T2) and per job's end, prepared once per
# connection (see PostgresTransaction._executed). Each names its tables and columns, so a
# migration that adds a column does not change what a prepared one returns.
_PREPARED_STATEMENTS = frozenset(
    {
        _claim_statement(runnable_jobs(0.0, None, ())[0]),  # (the next job, any)
        LEDGER_INSERT_NEW,
        LOCK_JOB,
        HEAD_SELECT,
        _APPEND_GUARD,
        EVENT_INSERT,
        LEDGER_FINISH,
        STATUS_UPDATE_FENCED,
        KEY_INSERT,
        SEAL_INSERT,
        LEAF_QUEUE_INSERT,
        _CLAIMED_LOG,
    }
)
# A multi-row insert is one prepared statement per number of rows, up to this many (a tool
# step appends 2 or 3 events at a time); a longer one is sent as it is.
_PREPARED_ROWS_MAX = 8


@functools.lru_cache(maxsize=64)
def _statement_name(sql: str, rows: int) -> str:
    """The name a connection prepares ``sql`` under (``rows``: of its VALUES): from its text,
    so the same statement has the same name on every connection and in every process."""
    return f"affidavit_{hashlib.sha256(sql.encode()).hexdigest()[:16]}_{rows}"


@functools.lru_cache(maxsize=64)
def _numbered(sql: str, rows: int) -> str:
    """``sql`` with its ``?`` placeholders numbered ``$1``, ``$2``, ... for ``PREPARE``,
    with ``rows`` rows when it is an ``INSERT ... VALUES (?, ...)`` (else ``rows`` is 1)."""
    values = _single_row_values(sql)
    if rows > 1 and values is not None:
        sql = sql[: len(sql) - len(values)] + ", ".join([values] * rows)
    pieces = sql.split("?")
    numbered = [pieces[0]]
    for number, piece in enumerate(pieces[1:], start=1):
        numbered.append(f"${number}{piece}")
    return "".join(numbered)


# SQLSTATEs of affidavit_append_guard's refusals (migration 9)
_GUARD_STATES = frozenset({"AFJ01", "AFJ02", "AFJ03", "AFJ04"})


def guard_refusal(exc: psycopg.Error) -> AffidavitError | None:
    """The error an append's own check raises, for a refusal of ``affidavit_append_guard``
    (``None`` for any other error)."""
    if exc.sqlstate not in _GUARD_STATES:
        return None
    said = json.loads(exc.diag.message_detail or "{}")
    job_id = str(said.get("job_id"))
    if exc.sqlstate == "AFJ01":
        return JobNotFound(job_id)
    if exc.sqlstate == "AFJ02":
        return fenced(job_id, str(said["fence"]), said.get("current"))
    if exc.sqlstate == "AFJ03":
        return conflict(job_id, int(said["expected"]), int(said["actual"]))
    return head_moved(job_id, int(said["expected"]))


def cancel_refusal(exc: psycopg.Error) -> CancelRequestedError | None:
    """A write refused because the job has a cancel request (migration 17, AFJ05)."""
    if exc.sqlstate != "AFJ05":
        return None
    job_id = str(json.loads(exc.diag.message_detail or "{}").get("job_id"))
    return CancelRequestedError(f"job {job_id} was asked to cancel", job_id=job_id)


def ledger_row_exists(exc: psycopg.Error) -> LedgerRowExists | None:
    """A ledger insert sent as presumed new (send_presumed_new) that met the key's row."""
    if not isinstance(exc, psycopg.errors.UniqueViolation):
        return None
    if exc.diag.table_name != "tool_invocations":
        return None
    return LedgerRowExists("the tool step's ledger row already exists; nothing was written")


# libpq's chunked-rows mode (libpq 17, which psycopg[binary] bundles); with an older libpq the
# snapshots stream through server-side cursors
CHUNKED_ROWS = psycopg.pq.version() >= 170000
_cursor_names = itertools.count()
# Reads of a log or ledger in key order, in snapshots and in pages. The planner estimates a
# job's rows from the table's statistics, which know nothing of one long job among many short
# ones (nor of any job before the table is next analyzed): for "WHERE job_id = ? ORDER BY
# version" it then collects the job's rows with a bitmap scan and sorts them — for 100,000
# events a 37 MB sort spilled to disk before the first row is sent, and for every page of
# "... LIMIT n" a sort of all the rows after it (paging through a log becomes quadratic).
# The primary keys hold those rows in that order: with sorting made the planner's last resort
# it walks the key instead, and rows stream from the first. Only where those are read:
# snapshots (which begin so and set the default back before listing jobs: see
# PostgresSnapshot), a log read by the store (in a transaction of its own: see _log_reader) or
# in a transaction (PostgresTransaction.list_events).
IN_KEY_ORDER = "SET LOCAL enable_sort = off"
IN_KEY_ORDER_RESET = "SET LOCAL enable_sort TO DEFAULT"
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


# The URL parameters that are ours, not libpq's: removed before the URL reaches libpq.
OWN_PARAMETERS = ("schema", "pool_size", "pool_timeout", "prepare")
DEFAULT_POOL_SIZE = 10
MAX_POOL_SIZE = 1000
# How long an operation waits for a connection of the pool, in seconds: while the server is
# away no connection comes, and each try of a write or a claim waits this long before it fails
# as unavailable (and is tried again); a connection is otherwise held for one transaction.
DEFAULT_POOL_TIMEOUT = 10.0


def split_url(url: str) -> tuple[str, str | None]:
    """Return (libpq conninfo URL, schema) after removing our parameters (``schema``,
    ``pool_size``, ``pool_timeout``, ``prepare``)."""
    base, _, query = url.partition("?")
    params = parse_qsl(query, keep_blank_values=True)
    schema = None
    rest = []
    for key, value in params:
        if key == "schema":
            schema = value
        elif key not in OWN_PARAMETERS:
            rest.append((key, value))
    if schema is not None and not _SCHEMA_NAME.match(schema):
        raise ConfigError(
            f"invalid schema name {schema!r} in the database URL",
            hint="A schema name is letters, digits and '_', not starting with a digit.",
        )
    # (re-encoded as libpq decodes: %20 for a space, never "+", which libpq keeps as it is)
    return (base + ("?" + urlencode(rest, quote_via=quote) if rest else "")), schema


def _url_values(url: str, name: str) -> list[str]:
    """Every value the URL's query gives parameter ``name``, in order."""
    return [v for k, v in parse_qsl(url.partition("?")[2], keep_blank_values=True) if k == name]


def pool_size_of(url: str) -> int:
    """The most connections a store opened on ``url`` holds: the URL's ``pool_size``
    (1 to 1,000), else 10.

    Raises:
        ConfigError: ``pool_size`` is given but is not such a number (or is given twice).
    """
    values = _url_values(url, "pool_size")
    if not values:
        return DEFAULT_POOL_SIZE
    text = values[-1]
    if len(values) > 1 or not _DIGITS.fullmatch(text) or not 1 <= int(text) <= MAX_POOL_SIZE:
        shown = ", ".join(repr(v) for v in values)
        raise ConfigError(
            f"invalid pool_size {shown} in the database URL",
            hint=f"Give pool_size once, as a whole number from 1 to {MAX_POOL_SIZE:,} "
            f"(connections; the default is {DEFAULT_POOL_SIZE}).",
        )
    return int(text)


def pool_timeout_of(url: str) -> float:
    """How long an operation of a store opened on ``url`` waits for a pooled connection: the
    URL's ``pool_timeout`` (seconds, a positive finite number), else 10.

    Raises:
        ConfigError: ``pool_timeout`` is given but is not such a number (or is given twice).
    """
    values = _url_values(url, "pool_timeout")
    if not values:
        return DEFAULT_POOL_TIMEOUT
    try:
        seconds = float(values[-1]) if len(values) == 1 else math.nan
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        shown = ", ".join(repr(v) for v in values)
        raise ConfigError(
            f"invalid pool_timeout {shown} in the database URL",
            hint="Give pool_timeout once, as a positive number of seconds (how long an "
            f"operation waits for a connection; the default is {DEFAULT_POOL_TIMEOUT:g}).",
        )
    return seconds


def prepare_of(url: str) -> bool:
    """Whether a store opened on ``url`` prepares its hot statements on the server (see
    :meth:`PostgresTransaction._executed`): the URL's ``prepare`` (``on`` or ``off``), else
    on. Off is for a connection pooler in transaction mode, which may give each transaction
    another server session than the one that prepared a statement.

    Raises:
        ConfigError: ``prepare`` is given but is neither ``on`` nor ``off`` (or is given twice).
    """
    values = _url_values(url, "prepare")
    if not values:
        return True
    if len(values) > 1 or values[0] not in ("on", "off"):
        shown = ", ".join(repr(v) for v in values)
        raise ConfigError(
            f"invalid prepare {shown} in the database URL",
            hint="Give prepare once, as on (the default) or off (behind a connection pooler "
            "in transaction mode).",
        )
    return values[0] == "on"


def store_error(message: str, exc: psycopg.Error) -> StoreError:
    """``exc`` as a :class:`StoreError`; a :class:`StoreUnavailable` when it may pass: a lost
    or refused connection, a server shutting down, a serialization failure or deadlock
    (psycopg's ``OperationalError`` and its subclasses) — but not this store being closed
    (``PoolClosed``), which no wait undoes."""
    transient = isinstance(exc, psycopg.OperationalError) and not isinstance(exc, PoolClosed)
    if getattr(exc, "sqlstate", None) == _DISK_FULL:
        return StoreUnavailable(f"{message}: {exc}", hint=FULL_DISK_HINT)
    return (StoreUnavailable if transient else StoreError)(f"{message}: {exc}")


# What a server says when it refuses a session for now (libpq gives no SQLSTATE for a failed
# connection, only the server's FATAL message): starting up, shutting down, in recovery, out of
# connection slots, a database closed to connections for the moment.
_TRANSIENT_FATAL = (
    "starting up",
    "shutting down",
    "recovery mode",
    "not yet accepting connections",
    "too many clients",
    "connection slots are reserved",
    "not currently accepting connections",
    "terminating connection",
)


def connect_may_pass(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt may succeed when tried again: the server was not
    reachable at all (refused, no route, timed out, closed the connection), or answered that
    it cannot take a session now. A refused login or a missing database or role (any other
    ``FATAL``) will not pass by waiting."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    text = str(exc)
    if "FATAL:" not in text:
        return True
    fatal = text.split("FATAL:", 1)[1]
    return any(marker in fatal for marker in _TRANSIENT_FATAL)


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``, for messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


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

    def close(self) -> None:
        self._pool.close()
