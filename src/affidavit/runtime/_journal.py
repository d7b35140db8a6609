"""The log one run writes, and what tells the run to end.

Every write appends at the run's known version and is fenced by the claim's attempt id, so a
run that lost its lease (or raced another writer) writes nothing. The journal also knows its
log's chain head (it wrote the last event, or read it when the job was claimed), so an append
chains from it without reading it back; the store still refuses the append if anyone else wrote
in between. Version and head advance only when a transaction commits.

Both kinds of job write through a :class:`Journal`: the plan runner, the agent runner and the
step executor they share.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

from affidavit.core.canonical import canonical
from affidavit.core.errors import StoreUnavailable
from affidavit.core.events import utc_now
from affidavit.core.ids import new_event_ids
from affidavit.record import Sealer
from affidavit.runtime._metrics import RuntimeMetrics
from affidavit.runtime._run_base import (
    DEFAULT_STORE_RETRY_SECONDS,
    Claim,
    Item,
    Outage,
    Stop,
    check_lease,
    fail_closed,
    log,
    open_closings,
    step_payload,
)
from affidavit.store import Store, Transaction

T = TypeVar("T")


class RunControl:
    """What ends a run early, asked at step boundaries and before a tool acts: a heartbeat
    that found the lease lost, the lease confirmation before a tool call, the worker stopping,
    and (concurrent steps) something else that already decided the run's end."""

    def __init__(
        self,
        job_id: str,
        *,
        lease_lost: threading.Event | None = None,
        confirm_lease: Callable[[], bool] | None = None,
        stopping: threading.Event | None = None,
        store_retry_seconds: float = DEFAULT_STORE_RETRY_SECONDS,
        cancel_asked: threading.Event | None = None,
    ) -> None:
        self.job_id = job_id
        self.lease_lost = lease_lost
        # set once a heartbeat found the job asked to cancel: what a tool's ctx.cancelled reads
        self.cancel_asked = cancel_asked if cancel_asked is not None else threading.Event()
        self._confirm_lease = confirm_lease
        # set when the worker is asked to stop: the run ends at the next step boundary
        self.stopping = stopping
        # set, in a run of concurrent steps, once something ends the run (a step's failure, a
        # lost lease): the steps still running record their outcome but start no new try
        self.ending = threading.Event()
        # how long a run keeps trying a write while the database is unavailable
        self.store_retry_seconds = store_retry_seconds

    def check_lease(self) -> None:
        """Stop the run (``"lost"``) when a heartbeat found its lease taken."""
        check_lease(self.lease_lost)

    def outage(self) -> Outage:
        """The waits of one stretch of database unavailability."""
        return Outage(self.job_id, self.store_retry_seconds, self.check_lease)

    def ending_now(self) -> bool:
        """Whether the worker is stopping or (concurrent steps) the run is ending."""
        return self.ending.is_set() or (self.stopping is not None and self.stopping.is_set())

    def check_stopping(self) -> None:
        """At a step boundary (no invocation of this run open): end the run as ``released`` if
        the worker is stopping; the worker then gives the job's lease back. In a run of
        concurrent steps that is ending already, end this step here too: what ends the run
        decides its outcome, not this."""
        if self.ending_now():
            raise Stop("released")

    def confirm_lease(self) -> None:
        """Before the run acts on the world (calls a tool or a compensation): stop unless the
        lease is surely still this run's (:meth:`~affidavit.runtime._lease.Lease.confirm`).
        While the database is unavailable for the renewal this needs, ask again, so that an
        outage right after T1 does not leave an invocation open that never ran.

        Raises:
            Stop: ``"lost"``.
        """
        self.check_lease()
        if self._confirm_lease is None:
            return
        outage: Outage | None = None
        while True:
            try:
                if self._confirm_lease():
                    return
                break
            except StoreUnavailable as exc:
                outage = outage or self.outage()
                if not outage.wait(exc, "confirming the lease before the tool is called"):
                    break
        raise Stop("lost")


class Journal:
    """The writes of one run of one job (one claim), serialized among its concurrent steps.

    ``node_type`` names the kind of a node id (``tool``, ``pure``, ``wait``, ...) for the step
    metrics counted when a transaction with its ``node_finished`` commits."""

    def __init__(
        self,
        store: Store,
        claim: Claim,
        hashes: list[bytes],
        *,
        control: RunControl,
        metrics: RuntimeMetrics,
        sealer: Sealer,
        node_type: Callable[[str], str],
    ) -> None:
        self.store = store
        self.claim = claim
        self.version = len(hashes)
        self.head = hashes[-1] if hashes else b""  # raw H_version
        # every event's raw chain hash (H_1 .. H_version), the leaves of the job's seal; None
        # once unknown (after a commit reported as failed had landed: the seal reads them)
        self._hashes: list[bytes] | None = hashes
        self.control = control
        self.metrics = metrics
        self.sealer = sealer  # signs the seal in the transaction of the terminal event
        self._node_type = node_type
        # Steps of one run may execute concurrently; their transactions and the known version
        # are serialized by this lock.
        self.lock = threading.RLock()
        # (version, head, finished steps) a transaction that failed at its commit would have
        # left had the commit landed
        self._attempted: tuple[int, bytes, tuple[tuple[str, str], ...]] | None = None
        # (node type, result type) of the node_finished events of the open transaction
        self._finished_steps: list[tuple[str, str]] = []
        # told (job id, version at claim) after a commit that finished a step (the spans of
        # affidavit.integrations.otel); what it raises is its own affair, never the run's
        self.on_step: Callable[[str, int], None] | None = None
        self.claimed_version = self.version

    @property
    def job_id(self) -> str:
        return self.claim.job_id

    # --- transactions -------------------------------------------------------------------------

    def tx(self, *, durable: bool) -> AbstractContextManager[Transaction]:
        """A store transaction, exclusive among the run's concurrently executing steps. The
        journal's version and head are restored if it does not commit."""
        return _JournalTransaction(self, durable)

    def tx_retrying(self, durable: bool, body: Callable[..., T], *args: Any) -> T:
        """``body(tx, *args)`` in a journal transaction, tried again while the database is
        unavailable (:class:`StoreUnavailable`) for up to ``store_retry_seconds``, so that a
        restart or a failover of the database does not cut a step between its tool call and
        its record.

        A commit reported as failed may have landed (the connection broke after the server
        committed). Before trying again, the job's head is compared with the head that commit
        would have made — the chain hash covers this run's new event ids, so only that commit
        can have made it — and a commit that landed is taken as done, with the result its body
        returned: nothing is written twice. Otherwise ``body`` runs again in a new transaction,
        fenced as always, so a run whose lease was taken meanwhile writes nothing
        (:class:`FencedError`).

        Raises:
            StoreUnavailable: the database stayed unavailable for ``store_retry_seconds``.
            Stop: ``"lost"``, when a heartbeat found the lease taken while waiting.
        """
        # The lock is held throughout, so that the concurrent steps of this run do not write
        # in between a commit whose outcome is unknown and the check of its head.
        with self.lock:
            job_id = self.claim.job_id
            outage: Outage | None = None  # made at the first failure: none on the usual path
            # a commit that may have landed: what it would have left, and what its body returned
            unknown: tuple[tuple[int, bytes, tuple[tuple[str, str], ...]], T] | None = None
            while True:
                body_returned = False
                try:
                    if unknown is not None:
                        ((version, head, steps), returned) = unknown
                        with self.tx(durable=False) as tx:
                            landed = tx.head(job_id) == (version, head)
                        unknown = None
                        if landed:
                            self.version, self.head, self._hashes = version, head, None
                            for node_type, result_type in steps:
                                self.metrics.steps.inc(node_type, result_type)
                            self.metrics.store_retries.inc("landed")
                            log.info("job %s: a commit reported as failed had landed", job_id)
                            return returned
                    self._attempted = None
                    with self.tx(durable=durable) as tx:
                        result = body(tx, *args)
                        body_returned = True
                    return result
                except StoreUnavailable as exc:
                    attempted, self._attempted = self._attempted, None
                    if body_returned and attempted is not None:
                        unknown = (attempted, result)  # failed at the commit: landed or not
                    outage = outage or self.control.outage()
                    if not outage.wait(exc, "trying the write again"):
                        self.metrics.store_retries.inc("gave_up")
                        raise
                    self.metrics.store_retries.inc("retried")

    # --- appends ------------------------------------------------------------------------------

    def append(
        self, tx: Transaction, *items: Item, fast: bool = False, ids: list[str] | None = None
    ) -> None:
        """Append events (``at`` added). ``fast``: every payload is one the runtime built for a
        step (see :func:`~affidavit.runtime._run_base.step_payload`); otherwise each is
        canonicalized in full. ``ids``: the events' ids, made by the caller together with
        other ids it needs; new ones otherwise."""
        at = utc_now()
        encode = step_payload if fast else canonical
        encoded = [
            (event_id, event_type, encode({**payload, "at": at}))
            for event_id, (event_type, payload) in zip(
                ids if ids is not None else new_event_ids(len(items)), items, strict=True
            )
        ]
        hashes = tx.append(
            self.claim.job_id,
            encoded=encoded,
            expected_version=self.version,
            fence=self.claim.attempt_id,
            head=self.head,
            hashes=True,
        )
        if hashes:
            self.head = hashes[-1]
            self.version += len(hashes)
            if self._hashes is not None:
                self._hashes += hashes
        for event_type, payload in items:
            if event_type == "node_finished":  # counted when the transaction commits
                node_type = self._node_type(payload["node_id"])
                self._finished_steps.append((node_type, payload["result_type"]))

    def _append_items(self, tx: Transaction, items: tuple[Item, ...], fast: bool) -> None:
        self.append(tx, *items, fast=fast)

    def write(self, *items: Item, durable: bool = False, fast: bool = False) -> None:
        """Append ``items`` in a transaction of their own (see :meth:`tx_retrying`)."""
        self.tx_retrying(durable, self._append_items, items, fast)

    # --- the job's state ----------------------------------------------------------------------

    def park(
        self,
        reason: str,
        *,
        node_id: str | None,
        step_id: str | None,
        detail: dict[str, Any],
        idempotency_key: str | None = None,
    ) -> Stop:
        """Park the job (a person decides with ``affidavit resume``): it holds no lease and
        no worker until then. Returns the :class:`Stop` to raise."""
        parked: dict[str, Any] = {"reason": reason, "node_id": node_id, "step_id": step_id}
        if idempotency_key is not None:
            parked["idempotency_key"] = idempotency_key
        parked["detail"] = detail

        def write(tx: Transaction) -> None:
            self.append(tx, ("job_parked", parked))
            tx.set_status(self.claim.job_id, status="parked", fence=self.claim.attempt_id)
            tx.set_lease(self.claim.job_id, attempt_id=None, owner=None, expires_at=None)

        self.tx_retrying(True, write)
        return Stop("parked")

    def wait(self, *items: Item, wake_at: float | None = None) -> Stop:
        """Record that the job waits (``items``: its ``job_waiting`` and what precedes it) and
        give its lease back: no worker holds a waiting job. ``wake_at`` (seconds since the
        epoch): a timer — the job becomes claimable again then, without a signal. Returns the
        :class:`Stop` to raise."""

        def write(tx: Transaction) -> None:
            self.append(tx, *items)
            tx.set_status(self.claim.job_id, status="waiting", fence=self.claim.attempt_id)
            tx.set_lease(self.claim.job_id, attempt_id=None, owner=None, expires_at=wake_at)

        self.tx_retrying(True, write)
        return Stop("waiting")

    def complete(self, output: Any) -> None:
        """Complete the job with ``output`` and seal it, in one durable transaction."""

        def write(tx: Transaction) -> None:
            self.append(tx, ("job_completed", {"output": output}))
            tx.set_status(
                self.claim.job_id, status="completed", output=output, fence=self.claim.attempt_id
            )
            self.seal(tx)
            self._carry_next_claim(tx)

        self.tx_retrying(True, write)

    def fail_job(self, node_id: str | None, error: dict[str, Any]) -> None:
        """Fail the job with ``error``; invocations still open are closed first (see
        :meth:`close_open`)."""

        def write(tx: Transaction) -> None:
            self.close_open(tx)
            self.append(tx, ("job_failed", {"error": error, "node_id": node_id}))
            tx.set_status(
                self.claim.job_id, status="failed", error=error, fence=self.claim.attempt_id
            )
            self.seal(tx)
            self._carry_next_claim(tx)

        self.tx_retrying(True, write)

    def _carry_next_claim(self, tx: Transaction) -> None:
        """In the transaction that completes or fails the job: the worker's next claim goes
        with it (:meth:`~affidavit.store.Transaction.claim_after_commit`), made now — the run
        returns right after that commit. (A park or a wait does not carry it: an agent's calls
        still running may keep the run for long after them.) Sent once: a transaction tried
        again does not carry it (the store sends a request once)."""
        make = self.claim.next_claim
        request = make() if make is not None else None
        if request is not None:
            tx.claim_after_commit(request)

    def seal(self, tx: Transaction) -> None:
        """Seal the job in ``tx``, which appended its terminal event: the log as the run
        leaves it, whose head and chain hashes the journal knows."""
        self.sealer.seal_txn(
            tx, self.claim.job_id, head=(self.version, self.head.hex()), hashes=self._hashes
        )

    def restore(self, version: int, head: bytes) -> None:
        """Go back to the log at ``(version, head)``: what a transaction that did not commit
        leaves."""
        self.version, self.head = version, head
        if self._hashes is not None:
            del self._hashes[version:]

    def close_open(self, tx: Transaction, keep: str | None = None) -> None:
        """In a transaction that ends the job: close every invocation still open (one a dead
        attempt started and this run never resolved); see
        :func:`~affidavit.runtime._run_base.open_closings`. ``keep``: a key the caller closes
        itself."""
        error = {
            "type": "unknown",
            "message": "the job ended while this invocation was open; "
            "the tool may or may not have acted",
        }
        closings = open_closings(tx, self.claim.job_id, error, skip=keep)
        if closings:
            self.append(tx, *closings)  # the job's row first, then its ledger rows
            fail_closed(tx, self.claim.job_id, closings, error)


class _JournalTransaction:
    """:meth:`Journal.tx` (a class rather than a generator: every tool step opens two)."""

    __slots__ = ("_inner", "_journal", "_saved")

    def __init__(self, journal: Journal, durable: bool) -> None:
        self._journal = journal
        self._inner = journal.store.transaction(durable=durable)

    def __enter__(self) -> Transaction:
        j = self._journal
        j.lock.acquire()
        try:
            # read under the lock: what to restore if this transaction does not commit
            self._saved = (j.version, j.head)
            j._finished_steps.clear()
            return self._inner.__enter__()
        except BaseException:
            j.lock.release()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        j = self._journal
        finished = False
        try:
            self._inner.__exit__(exc_type, exc, tb)
            if exc is not None:
                j.restore(*self._saved)
            else:
                for node_type, result_type in j._finished_steps:
                    j.metrics.steps.inc(node_type, result_type)
                finished = bool(j._finished_steps)
        except BaseException:
            if (j.version, j.head) != self._saved:  # the commit failed after appends
                j._attempted = (j.version, j.head, tuple(j._finished_steps))
            j.restore(*self._saved)
            raise
        finally:
            j._finished_steps.clear()
            j.lock.release()
        if exc is None and finished and j.on_step is not None:
            try:
                j.on_step(j.job_id, j.claimed_version)
            except Exception:  # telemetry must not fail a step
                log.warning("job %s: the step hook failed", j.job_id, exc_info=True)
