"""The job-lease, cancel-request and limit writes of the storage contract: who may run a job
now (claims of jobs, their leases and heartbeats), whether it may still start work (cancel
requests) and whether a tool or model call may start now (limits, see
:mod:`affidavit.store._limits`). Part of :class:`~affidavit.store.base.Transaction`."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from affidavit.store._limits import GrantTaken, LimitUsage
    from affidavit.store._types import CancelRequest, Claimed, NextClaim


class LeaseTransaction(Protocol):
    """Claims of jobs and their leases, in a write transaction."""

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
        ``skip``: jobs not to claim. A job whose lease expired with an owner is ``recovered``
        (see :class:`Claimed`). ``with_log``: read the job's log with the claim where that
        costs no round trip of its own (see :attr:`Claimed.log`)."""
        ...

    def claim_after_commit(self, request: NextClaim) -> None:
        """Make ``request``'s claim once this transaction has committed, in a transaction of
        its own, where that costs no round trip of its own (PostgreSQL: it travels in the
        commit's message, after the commit, and runs only if the commit did); elsewhere, and
        when ``request`` was sent already, nothing is done. What came of it is in ``request``
        after the commit (see :class:`NextClaim`). A claim that fails leaves this
        transaction's commit as it was; a commit that fails leaves the claim unmade."""
        ...

    def heartbeat(
        self, job_id: str, attempt_id: str, expires_at: float, now: float | None = None
    ) -> bool:
        """Extend the lease if ``attempt_id`` still holds it; ``False`` if it was lost. Given
        ``now`` (the clock leases are read by), a lease already expired at ``now`` on a job of
        a named queue is extended only if the queue's limits allow it, as a claim would be
        (:mod:`affidavit.store.queue_leases`)."""
        ...

    def set_recoveries(self, job_id: str, attempt_id: str, count: int, progress: int) -> None:
        """Record, fenced by ``attempt_id``, that this claim is the ``count``-th recovery in a
        row of the job, at ``progress`` (see :class:`Claimed`)."""
        ...

    def release_lease(
        self,
        job_id: str,
        attempt_id: str,
        at: float,
        *,
        keep_owner: bool = False,
        untouched: bool = False,
    ) -> bool:
        """Give ``attempt_id``'s lease back (it expires at ``at``, no owner unless
        ``keep_owner``; ``untouched`` without ``keep_owner``: the job is ``pending`` again);
        ``False`` if the attempt no longer holds it."""
        ...

    def set_lease(
        self, job_id: str, *, attempt_id: str | None, owner: str | None, expires_at: float | None
    ) -> None:
        """Give the job's lease to a new attempt (or clear it). Later fenced writes must carry
        ``attempt_id``."""
        ...


class CancelTransaction(Protocol):
    """Cancel requests (see affidavit.store._cancels), in a write transaction."""

    def cancel_request(self, job_id: str) -> CancelRequest | None:
        """The cancel request in force for ``job_id``, if one was recorded."""
        ...

    def request_cancel(
        self, job_id: str, *, at: str, reason: str | None, by: str | None
    ) -> CancelRequest:
        """Record a cancel request for ``job_id`` (its row locked by the caller, see
        :meth:`~affidavit.store.base.Transaction.get_job`): from then on the store refuses to
        start a new invocation of the job (:class:`~affidavit.core.errors.CancelRequestedError`),
        to complete it or to make it wait. The first request stays in force, and is returned,
        when there is one already."""
        ...


class LimitTransaction(Protocol):
    """Tool and model limits (see affidavit.store._limits), in a write transaction."""

    def limit_take(
        self,
        name: str,
        *,
        grant_id: str,
        job_id: str,
        attempt_id: str,
        clock: Callable[[], int],
        rate: tuple[int, int] | None,
        concurrency: int | None,
    ) -> GrantTaken:
        """Take a grant of limit ``name`` for the claim ``attempt_id`` if its rate (count,
        period in µs) and concurrency allow it now, exactly across concurrent takers; else
        write nothing and say how long to wait."""
        ...

    def limit_release(self, grant_id: str, *, at_us: int) -> None:
        """End a grant: its call is over."""
        ...

    def limit_usage(self, *, now_us: int) -> list[LimitUsage]:
        """Every limit's use at ``now_us``: grants in flight, and started in its window."""
        ...
