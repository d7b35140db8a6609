"""The PostgreSQL backend's transaction: statements queued and sent together with the next
round trip (a commit, a read), the append guard checked on the server, and T1/T2 in one message
each (see :mod:`affidavit.store.postgres`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Sequence
from typing import Any, cast

import psycopg

from affidavit.core.events import utc_now
from affidavit.store._ledger import (
    runnable_jobs,
)
from affidavit.store._pg_statements import (
    _APPEND_GUARD,
    _CLAIMED_LOG,
    _PREPARED_ROWS_MAX,
    _PREPARED_STATEMENTS,
    IN_KEY_ORDER,
    IN_KEY_ORDER_RESET,
    SKIP_LOCKED,
    _claim_statement,
    _claimed,
    _first,
    _literal,
    _numbered,
    _results,
    _single_row_values,
    _statement_name,
)
from affidavit.store._sql import (
    HEAD_SELECT,
    LOCK_JOB,
    SqlTransaction,
)
from affidavit.store._sql_rows import (
    job_from_row,
)
from affidavit.store.base import (
    Claimed,
    Encoded,
    JobRecord,
    NextClaim,
    StoredEvent,
)

log = logging.getLogger("affidavit.store")
_KEY_REGISTRY_LOCK = 0x6166666B6579  # "affkey": serializes registrations of the first seal key


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
    SKIP_LOCKED = SKIP_LOCKED
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

    def query_each(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[Any]]:
        # one round trip: every statement's rows (a batch of job inserts)
        if not statements:
            return []
        self._locked = None
        return self._send([self._bound(sql, params) for sql, params in statements])

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
