"""Transaction operations for the invocation ledger and for job leases (claim, heartbeat).

Mixed into :class:`~affidavit.store._sql.SqlTransaction`, so the runtime writes ledger rows,
lease changes and events in one transaction. SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from affidavit.core.canonical import canonical, parse
from affidavit.core.events import utc_now
from affidavit.core.privacy import is_sealed
from affidavit.store.base import Claimed, LedgerRow

if TYPE_CHECKING:
    from affidavit.core.privacy import JobCipher

LEDGER_COLUMNS = (
    "job_id, idempotency_key, node_id, step_id, tool_name, args_hash, status, invocation_id, "
    "attempt_id, tries, result, error"
)
# T1's insert of a started row (one per tool step: a constant, not formatted per call)
_LEDGER_INSERT = (
    f"INSERT INTO tool_invocations ({LEDGER_COLUMNS}, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, 'started', ?, ?, 1, NULL, NULL, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
# The same insert, failing on an existing key (the transaction with it): see send_presumed_new.
LEDGER_INSERT_NEW = _LEDGER_INSERT.removesuffix(" ON CONFLICT DO NOTHING")
# T2's end of the row: committed with its result, or failed with its error
LEDGER_FINISH = (
    "UPDATE tool_invocations SET status = ?, result = ?, error = ?, updated_at = ? "
    "WHERE job_id = ? AND idempotency_key = ? AND status <> 'committed'"
)
# A waiting job with a lease expiry is a timer (an agent's sleep, or a wait's timeout): it is
# runnable once that time has passed, without a signal.
RUNNABLE = (
    "(j.status = 'pending' OR (j.status = 'running' AND "
    "(j.lease_expires_at IS NULL OR j.lease_expires_at < ?)) OR "
    "(j.status = 'waiting' AND j.lease_expires_at < ?))"
)


def runnable_jobs(now: float, job_id: str | None, skip: Collection[str]) -> tuple[str, list[Any]]:
    """The query for the first runnable job a claim takes (``job_id``: only that one; never
    one of ``skip``), and its parameters; a claim adds its row lock."""
    sql = (
        "SELECT j.job_id, j.status, j.lease_owner, j.recoveries, j.recovery_progress "
        f"FROM jobs j WHERE {RUNNABLE} AND j.queue IS NULL"  # (other queues: store/queues.py)
    )
    params: list[Any] = [now, now]
    if job_id is not None:
        sql += " AND j.job_id = ?"
        params.append(job_id)
    if skip:
        sql += f" AND j.job_id NOT IN ({', '.join('?' * len(skip))})"
        params.extend(skip)
    return sql + " ORDER BY j.created_at, j.job_id LIMIT 1", params


def claimed_from_row(row: Sequence[Any]) -> Claimed:
    """The claim of a row :func:`runnable_jobs` read (as it was before the claim): a running
    job with an owner is a recovery, which keeps the count of the recoveries before it."""
    job_id, status, lease_owner, recoveries, progress = row
    if status == "running" and lease_owner is not None:
        return Claimed(job_id, True, int(recoveries), progress)
    return Claimed(job_id)


def _ledger_from_row(row: Sequence[Any]) -> LedgerRow:
    return LedgerRow(
        job_id=row[0],
        idempotency_key=row[1],
        node_id=row[2],
        step_id=row[3],
        tool_name=row[4],
        args_hash=row[5],
        status=row[6],
        invocation_id=row[7],
        attempt_id=row[8],
        tries=int(row[9]),
        # read as the log's payloads are (an integral double beyond 2^53 stays a double)
        result=parse(row[10]) if row[10] is not None else None,
        error=parse(row[11]) if row[11] is not None else None,
    )


class LedgerOps:
    """Ledger and lease statements; relies on the transaction primitives."""

    SKIP_LOCKED = ""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    if TYPE_CHECKING:  # (of SubjectOps, mixed in beside this)

        def job_cipher(self, job_id: str) -> JobCipher | None: ...

    def inserted(self, sql: str, params: Sequence[Any]) -> bool:
        """Run one ``INSERT … ON CONFLICT DO NOTHING`` of one row; whether the row went in."""
        return bool(self.query(sql + " RETURNING 1", params))

    def inserted_before_append(self, sql: str, params: Sequence[Any], job_id: str) -> bool:
        """:meth:`inserted`, for a row of ``job_id``'s ledger that an append to the job follows
        in this transaction (T1 of a tool step). A backend where the append's lock and head
        read are statements of their own may send them with the insert, in one round trip
        (:class:`~affidavit.store._pg_tx.PostgresTransaction`)."""
        return self.inserted(sql, params)

    # A backend whose every wait for an answer is a round trip sends a ledger insert the caller
    # presumes new with the append and the commit that follow it, unanswered; a row that was
    # there after all fails the whole transaction (LedgerRowExists). Elsewhere (SQLite: no
    # round trips) the insert is answered as usual.
    SENDS_PRESUMED_NEW = False

    def send_presumed_new(self, sql: str, params: Sequence[Any]) -> None:
        """Send ``sql`` (an insert that fails on an existing key). Called only where
        :attr:`SENDS_PRESUMED_NEW`; such a backend sends it without waiting for its answer and
        raises :class:`~affidavit.core.errors.LedgerRowExists` for a row already there."""
        self.execute(sql, params)

    # --- ledger -------------------------------------------------------------------------------

    def ledger_get(self, job_id: str, key: str) -> LedgerRow | None:
        rows = self.query(
            f"SELECT {LEDGER_COLUMNS} FROM tool_invocations "
            "WHERE job_id = ? AND idempotency_key = ?",
            (job_id, key),
        )
        return _ledger_from_row(rows[0]) if rows else None

    def ledger_list(self, job_id: str) -> list[LedgerRow]:
        rows = self.query(
            f"SELECT {LEDGER_COLUMNS} FROM tool_invocations WHERE job_id = ? "
            "ORDER BY created_at, idempotency_key",
            (job_id,),
        )
        return [_ledger_from_row(r) for r in rows]

    def ledger_open(self, job_id: str) -> list[LedgerRow]:
        """The job's rows still ``started``: invocations begun and never finished."""
        rows = self.query(
            f"SELECT {LEDGER_COLUMNS} FROM tool_invocations "
            "WHERE job_id = ? AND status = 'started' ORDER BY created_at, idempotency_key",
            (job_id,),
        )
        return [_ledger_from_row(r) for r in rows]

    def ledger_insert(
        self,
        *,
        job_id: str,
        key: str,
        node_id: str,
        step_id: str,
        tool_name: str,
        args_hash: str,
        invocation_id: str,
        attempt_id: str | None,
        presumed_new: bool = False,
    ) -> bool:
        """Insert a ``started`` row; ``False`` if the key already has one (the insert that
        only one attempt can win). The started events are appended next, in the same
        transaction (see :meth:`inserted_before_append`). ``presumed_new``: see
        :meth:`inserted_presumed_new`."""
        now = utc_now()
        params = (
            job_id,
            key,
            node_id,
            step_id,
            tool_name,
            args_hash,
            invocation_id,
            attempt_id,
            now,
            now,
        )
        if presumed_new and self.SENDS_PRESUMED_NEW:
            self.send_presumed_new(LEDGER_INSERT_NEW, params)
            return True
        return self.inserted_before_append(_LEDGER_INSERT, params, job_id)

    def ledger_restart(
        self, job_id: str, key: str, *, invocation_id: str, attempt_id: str | None
    ) -> None:
        """Move a ``failed`` (or resolved-as-lost) row back to ``started`` for a new try."""
        self.execute(
            "UPDATE tool_invocations SET status = 'started', invocation_id = ?, attempt_id = ?, "
            "tries = tries + 1, error = NULL, updated_at = ? "
            "WHERE job_id = ? AND idempotency_key = ? AND status <> 'committed'",
            (invocation_id, attempt_id, utc_now(), job_id, key),
        )

    def ledger_finish(
        self,
        job_id: str,
        key: str,
        *,
        status: str,
        result: Any = None,
        error: Any = None,
        result_jcs: bytes | None = None,
    ) -> None:
        """Mark the row ``committed`` (with its result) or ``failed`` (with the error). A
        committed row is never changed again. ``result_jcs``: the result's canonical bytes,
        when the caller has them already."""
        cipher = self.job_cipher(job_id)
        if cipher is not None:  # a subject's job: its result and error are stored sealed
            if result is not None and not is_sealed(result):
                result, result_jcs = cipher.seal(result), None
            if error is not None:
                error = cipher.seal(error)
        if result_jcs is None and result is not None:
            result_jcs = canonical(result)
        self.execute(
            LEDGER_FINISH,
            (
                status,
                result_jcs.decode() if result_jcs is not None else None,
                canonical(error).decode() if error is not None else None,
                utc_now(),
                job_id,
                key,
            ),
        )

    # --- leases -------------------------------------------------------------------------------

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
        """Claim one runnable job — pending, or running with an expired lease — for a new
        attempt; ``None`` if there is none. Concurrent claimers never get the same job.
        ``skip``: jobs not to claim (ones this worker cannot run). A job whose lease expired
        with an owner (its run did not hand it back) is ``recovered`` (see :class:`Claimed`).
        ``with_log`` is not read here (SQLite: a read after the claim costs no round trip, and
        its transaction holds the database's one write lock)."""
        candidates, params = runnable_jobs(now, job_id, skip)
        rows = self.query(candidates + self.SKIP_LOCKED, params)
        if not rows:
            return None
        claimed = claimed_from_row(rows[0])
        reset = "" if claimed.recovered else ", recoveries = 0, recovery_progress = NULL"
        self.execute(
            "UPDATE jobs SET status = 'running', attempt_id = ?, lease_owner = ?, "
            f"lease_expires_at = ?, updated_at = ?{reset} WHERE job_id = ?",
            (attempt_id, owner, now + lease_seconds, utc_now(), claimed.job_id),
        )
        return claimed

    def set_recoveries(self, job_id: str, attempt_id: str, count: int, progress: int) -> None:
        """Record, fenced by ``attempt_id``, that this claim is the ``count``-th recovery in a
        row of ``job_id`` at ``progress`` (a measure of the log the runtime chooses: the
        number of ``node_finished`` events)."""
        self.execute(
            "UPDATE jobs SET recoveries = ?, recovery_progress = ? "
            "WHERE job_id = ? AND attempt_id = ?",
            (count, progress, job_id, attempt_id),
        )

    def heartbeat(
        self, job_id: str, attempt_id: str, expires_at: float, now: float | None = None
    ) -> bool:
        """Extend the lease if ``attempt_id`` still holds it; ``False`` if it was lost. Given
        ``now``, a lease already expired then on a job of a named queue is extended only
        within the queue's limits (:func:`~affidavit.store.queue_leases.renew_expired`)."""
        live = "" if now is None else " AND (queue IS NULL OR lease_expires_at >= ?)"
        rows = self.query(
            "UPDATE jobs SET lease_expires_at = ? WHERE job_id = ? AND attempt_id = ? "
            f"AND status = 'running'{live} RETURNING job_id",
            (expires_at, job_id, attempt_id) + (() if now is None else (now,)),
        )
        if rows or now is None:
            return bool(rows)
        from affidavit.store.queue_leases import renew_expired  # (queues imports this module)

        return renew_expired(self, job_id, attempt_id, expires_at, now)  # type: ignore[arg-type]

    def release_lease(
        self,
        job_id: str,
        attempt_id: str,
        at: float,
        *,
        keep_owner: bool = False,
        untouched: bool = False,
    ) -> bool:
        """Give the lease of ``attempt_id`` back: it expires at ``at`` (now) and names no
        owner, so any worker claims the job at once (with a new attempt id); ``False`` if the
        attempt no longer holds it. The attempt id stays until then: the job's writes are still
        fenced against everyone else. ``keep_owner``: the owner stays, so that the next claim
        is a recovery as this one was (a run that did nothing hands a recovered job back).
        ``untouched`` (the run did nothing) without ``keep_owner``: the job is ``pending``
        again, as it was claimed — not ``running`` with nobody running it; a claim treats the
        two alike (neither is a recovery)."""
        owner = "" if keep_owner else ", lease_owner = NULL"
        if untouched and not keep_owner:
            owner += ", status = 'pending'"
        rows = self.query(
            f"UPDATE jobs SET lease_expires_at = ?{owner} WHERE job_id = ? "
            "AND attempt_id = ? AND status = 'running' RETURNING job_id",
            (at, job_id, attempt_id),
        )
        return bool(rows)
