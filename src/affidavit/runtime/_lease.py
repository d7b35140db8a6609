"""A run's hold on its job: renewed by heartbeats, confirmed before the run acts on the world.

Fencing (every write carries the claim's attempt id) keeps a worker that lost its lease from
recording anything, but it cannot stop that worker from calling a tool. So before a tool is
called the run confirms its lease: it must not have been lost, and by this machine's clock it
must still run for at least a third of the lease (the heartbeat interval). When it does not —
the process was frozen (a stop-the-world pause, a suspended VM, SIGSTOP) or heartbeats kept
failing — the lease is renewed first, in a transaction fenced by the attempt id: if another
worker has reclaimed the job meanwhile, the renewal fails and the tool is not called. A lease
that expired without anyone reclaiming it is simply taken back, and a worker can only reclaim a
lease that has expired, so after a successful renewal nobody else can act on the step.

The margin of a third of the lease also covers clock skew between workers of up to that much.
What no lease can cover is a pause inside the tool itself: that is what the tool's
``reconcile`` hook and the in-flight policy are for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from affidavit.core.errors import StoreError, StoreUnavailable
from affidavit.runtime._run_base import Claim
from affidavit.store import JobRecord, Store


class Lease:
    """The lease of one claim. :meth:`renew` is the heartbeat; :meth:`confirm` is asked before
    every tool call."""

    def __init__(
        self,
        store: Store,
        claim: Claim,
        seconds: float,
        expires_at: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lost = threading.Event()
        # set by a renewal that finds the job asked to cancel (ToolContext.cancelled)
        self.cancel_asked = threading.Event()
        self.seconds = seconds
        self._store = store
        self._claim = claim
        self._expires_at = expires_at
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def job_id(self) -> str:
        """The job this lease is on."""
        return self._claim.job_id

    @property
    def expires_at(self) -> float:
        """Until when the database holds the lease for this claim, as last written by it."""
        with self._lock:
            return self._expires_at

    def renew(self) -> bool:
        """Extend the lease to ``seconds`` from now, if this claim still holds the job; when
        another attempt holds it, set :attr:`lost` and return ``False``. A cancel request in
        force, or a job cancelled with ``--force``, sets :attr:`cancel_asked` (one read in the
        same transaction, none once set).

        Raises:
            StoreError: the renewal could not be written (nothing is known either way).
        """
        now = self._clock()
        expires = now + self.seconds
        # Durable: the run may act on the world trusting this renewal (see :meth:`confirm`),
        # with no durable commit in between — a renewal a crash of the database could lose
        # would let another worker reclaim the job while this one calls the tool.
        with self._store.transaction(durable=True) as tx:
            alive = tx.heartbeat(self._claim.job_id, self._claim.attempt_id, expires, now)
            if not self.cancel_asked.is_set() and (
                tx.cancel_request(self._claim.job_id) is not None
                if alive
                else _cancelled(tx.get_job(self._claim.job_id))  # (a forced cancel)
            ):
                self.cancel_asked.set()
        if not alive:
            self.lost.set()
            return False
        with self._lock:
            self._expires_at = max(self._expires_at, expires)
        return True

    def release(self, *, untouched: bool = False) -> bool:
        """Give the job back: its lease expires now and names no owner, so any worker may claim
        it at once (with a new attempt id). ``False`` when another attempt holds it already.
        ``untouched``: the run did nothing, so a recovered job stays one for the next claim
        (which counts the recovery, see :meth:`~affidavit.store.base.Transaction.claim`).

        Raises:
            StoreError: the release could not be written (the lease then runs out on its own).
        """
        keep_owner = untouched and self._claim.recovered
        with self._store.transaction(durable=False) as tx:
            released = tx.release_lease(
                self._claim.job_id,
                self._claim.attempt_id,
                self._clock(),
                keep_owner=keep_owner,
                untouched=untouched,
            )
        self.lost.set()  # from here on this claim acts on nothing
        return released

    def confirm(self) -> bool:
        """Whether the run may act on the world now (see the module docstring): ``False`` when
        the lease was lost, or is running out and cannot be renewed.

        Raises:
            StoreUnavailable: the lease must be renewed and the database cannot be reached
                now; the caller may ask again (until then, the run must not act).
        """
        if self.lost.is_set():
            return False
        if self._clock() < self.expires_at - self.seconds / 3:
            return True
        try:
            return self.renew()
        except StoreUnavailable:
            raise
        except StoreError:
            return False  # not known to be ours: do not act


def _cancelled(job: JobRecord | None) -> bool:
    return job is not None and job.status == "cancelled"


class Heartbeats:
    """Keeps the leases of a worker's runs alive: one helper thread per run in progress, which
    renews the run's lease every ``interval`` seconds. A helper whose run ended serves the next
    one, so a worker does not start (and join) a thread per job; one idle for
    :attr:`idle_seconds` ends."""

    idle_seconds = 10.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Heartbeat] = []

    def keep(self, lease: Lease, interval: float) -> _Heartbeat:
        """Start renewing ``lease``; :meth:`_Heartbeat.stop` ends it (and must be called)."""
        while True:
            with self._lock:
                helper = self._idle.pop() if self._idle else None
            if helper is None:
                helper = _Heartbeat(self)
            if helper.serve(lease, interval):
                return helper
            # (it had just ended, idle: take another)

    def _idle_again(self, helper: _Heartbeat) -> None:
        with self._lock:
            self._idle.append(helper)


class _Heartbeat:
    """One helper thread of :class:`Heartbeats`. It renews under its condition's lock, so
    :meth:`stop` returns only when no renewal of the run's lease is under way, and none
    starts after it: a lease the run gives back right after is not extended again."""

    def __init__(self, pool: Heartbeats) -> None:
        self._pool = pool
        self._cond = threading.Condition()
        self._lease: Lease | None = None
        self._interval = 0.0
        self._due = 0.0
        self._ended = False
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def serve(self, lease: Lease, interval: float) -> bool:
        """Renew ``lease`` from ``interval`` seconds on; ``False`` if this helper has ended."""
        with self._cond:
            if self._ended:
                return False
            self._lease, self._interval = lease, interval
            self._due = time.monotonic() + interval
            self._cond.notify()
            return True

    def stop(self) -> None:
        """Stop renewing the lease (waiting for a renewal under way) and wait for the next run."""
        with self._cond:
            self._lease = None
            self._cond.notify()
        self._pool._idle_again(self)

    def _beat(self) -> None:
        with self._cond:
            while True:
                lease = self._lease
                if lease is None:
                    if not self._cond.wait(self._pool.idle_seconds) and self._lease is None:
                        self._ended = True
                        return
                    continue
                remaining = self._due - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                try:
                    if not lease.renew():
                        self._lease = None  # lost: the run stops before its next tool call
                except StoreError:
                    pass  # a transient failure: try again; fencing still protects writes
                # the next one an interval after this one ended: a renewal that takes longer
                # than the interval (a database that does not answer) is still followed by a
                # wait, in which stop() gets the lock
                self._due = time.monotonic() + self._interval
