"""A worker's claim loop: claim a job, run it, again, until the worker stops (see
:meth:`affidavit.runtime._worker.Worker.run`, which runs one per unit of concurrency).

While the database is unavailable a loop waits and tries again (:data:`OUTAGE_FIRST_WAIT`,
doubling, up to :data:`OUTAGE_MAX_WAIT` between tries); what ends a loop for good — a clock or
seal key the database refuses, a claim that fails otherwise, an outage past the worker's limit —
is kept in the :class:`LoopEnds` every loop of the run shares, and stops the others too.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from affidavit.core.errors import ClockSkewError, StoreUnavailable
from affidavit.record import SealKeyRefused
from affidavit.runtime._lease import Lease
from affidavit.runtime._run_base import Claim

if TYPE_CHECKING:
    from affidavit.runtime._worker import Worker
    from affidavit.store import NextClaim

# Waits of a claim loop between tries while the database is unavailable.
OUTAGE_FIRST_WAIT = 0.5
OUTAGE_MAX_WAIT = 5.0
log = logging.getLogger("affidavit.worker")


class Activity:
    """Which claim loops of one run are busy (have claimed, and not since found nothing to
    claim), and how many runs they have finished: with ``until_idle``, a loop that finds
    nothing to claim while another is busy waits for that one's run to end — a run makes jobs
    runnable (a parent's children, the parent its last child wakes) — and claims again; the
    loops end once none is busy and no run has ended since their last claim."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._busy: set[int] = set()
        self.finished = 0  # runs finished by the loops, or that made jobs runnable

    def busy(self, loop: int) -> None:
        with self._changed:
            self._busy.add(loop)

    def ran(self) -> None:
        """A run ended, or made jobs runnable: the loops waiting claim again."""
        with self._changed:
            self.finished += 1
            self._changed.notify_all()

    def work_may_come(self, loop: int, seen: int, timeout: float) -> bool:
        """After ``loop``'s claim found nothing (``seen``: :attr:`finished` before it): wait
        while another loop is busy and no run has finished since; ``True`` to claim again (a
        run finished, or ``timeout`` passed with a loop still busy), ``False`` when every loop
        is idle."""
        with self._changed:
            self._busy.discard(loop)
            if not self._busy:  # (the loops waiting on this one end too)
                self._changed.notify_all()
            deadline = time.monotonic() + timeout
            while self.finished == seen and self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                self._changed.wait(left)
            return self.finished != seen


@dataclass
class LoopEnds:
    """What ended the claim loops of one run of a worker, shared by them: any one of these
    stops every loop. ``activity``: which of them are busy (see :class:`Activity`)."""

    # what the first claim's clock check raised, when the database was unavailable at start
    refused: list[ClockSkewError | SealKeyRefused] = field(default_factory=list)
    gave_up: list[StoreUnavailable] = field(default_factory=list)  # the outage a loop gave up on
    claim_failed: list[Exception] = field(default_factory=list)  # a claim's error, not an outage
    activity: Activity = field(default_factory=Activity)

    def any(self) -> bool:
        return bool(self.gave_up or self.refused or self.claim_failed)


class ClaimLoop:
    """One claim loop of :meth:`Worker.run`: :meth:`run` claims and runs jobs until ``stop``
    is set, the worker stops, any loop of the run ended for good (see :class:`LoopEnds`) or,
    with ``until_idle``, no job is runnable."""

    def __init__(
        self, worker: Worker, stop: threading.Event, until_idle: bool, ends: LoopEnds
    ) -> None:
        self.worker = worker
        self.stop = stop
        self.until_idle = until_idle
        self.ends = ends
        self.outage_wait = 0.0  # while the database is unavailable: the wait before trying again
        self.outage_since: float | None = None  # since when this loop finds it unavailable
        self.last_error: StoreUnavailable | None = None  # what made it unavailable last
        # (job id, attempt id) of a run of this loop that gave up or raised. While that job
        # waits for the run's lease to expire, no job being runnable does not end the outage
        # (nor, with until_idle, the loop): the job comes back to be run when it expires.
        self.left: tuple[str, str] | None = None
        self.limit = worker.max_outage_seconds
        # the claim the last run sent with its job's end, if it sent one
        self.carried: _NextClaims | None = None

    def past_limit(self) -> bool:
        """Whether this loop has found the database unavailable for the limit."""
        return (
            self.limit is not None
            and self.outage_since is not None
            and time.monotonic() - self.outage_since >= self.limit
        )

    def run(self) -> None:
        worker = self.worker
        try:
            while not self.stop.is_set() and not worker._stopping.is_set() and not self.ends.any():
                if not self._turn():
                    return
        finally:
            self._hand_back_carried()

    def _turn(self) -> bool:
        """Claim a job and run it (or wait, when there is none or the database is away);
        ``False`` when the loop ends."""
        worker = self.worker
        claim: Claim | None = None
        activity = self.ends.activity
        seen = activity.finished
        try:
            request = self.carried.request if self.carried is not None else None
            self.carried = None
            made, claim = worker._carried(request)
            if not made or (claim is None and worker.queue_claims.any()):
                claim = None if worker._stopping.is_set() else worker.claim()
            if claim is None and self.left is not None:
                if worker._still_leased(*self.left):  # not idle: wait for it
                    if self.last_error is not None and self.past_limit():
                        self.ends.gave_up.append(self.last_error)
                        return False
                    worker._stopping.wait(worker.poll_seconds)
                    return True
                self.left = None  # taken up again (by anyone), or ended
            ran = None
            if claim is not None:
                activity.busy(id(self))
                self.carried = _NextClaims(worker, self.stop)
                claim = dataclasses.replace(
                    claim, next_claim=self.carried, made_runnable=activity.ran
                )
                try:
                    ran = worker.run_claim(claim)
                finally:
                    activity.ran()
        except (ClockSkewError, SealKeyRefused) as exc:
            self.ends.refused.append(exc)
            return False
        except StoreUnavailable as exc:
            return self._outage(exc, claim)
        except Exception as exc:
            if claim is None:
                # The claim itself (or the look at a job left behind) failed, and not
                # because the database is away: trying again at once would only fail
                # the same way, in a busy loop. The worker stops with the error.
                self.ends.claim_failed.append(exc)
                return False
            # A job whose run raised unexpectedly keeps its lease until it expires and
            # is then run again (by this loop too, as one whose run gave up: not idle
            # meanwhile; parked as crash_loop if it keeps happening); this loop goes on
            # with other jobs.
            log.exception("worker %s: a job run failed unexpectedly", worker.worker_id)
            if claim is not None:
                self.left = (claim.job_id, claim.attempt_id)
            ran = "error"
        if self.outage_since is not None:
            log.warning("worker %s: the database is reachable again", worker.worker_id)
        self.outage_wait, self.outage_since, self.last_error = 0.0, None, None
        if ran is None:
            # a queue's rate holding jobs back: not idle, and wake when it allows
            held = worker.queue_claims.rate_wait()
            if worker._stopping.is_set():
                return False
            if self.until_idle and held is None:
                return activity.work_may_come(id(self), seen, worker.poll_seconds)
            self.stop.wait(worker.poll_seconds if held is None else min(held, 1.0))
        return True

    def _outage(self, exc: StoreUnavailable, claim: Claim | None) -> bool:
        """A restart or failover of the database: no traceback, and no busy loop. A job whose
        run gave up keeps its lease until it expires and is then reclaimed, its open
        invocation resolved as after a crash. ``False`` when the outage is past the limit."""
        now = time.monotonic()
        self.outage_since = now if self.outage_since is None else self.outage_since
        self.last_error = exc
        if claim is not None:  # its run gave up
            self.left = (claim.job_id, claim.attempt_id)
        if self.past_limit():
            self.ends.gave_up.append(exc)
            return False
        self.outage_wait = min(max(2 * self.outage_wait, OUTAGE_FIRST_WAIT), OUTAGE_MAX_WAIT)
        if self.limit is not None:  # (not past the limit: give up on time)
            self.outage_wait = min(self.outage_wait, max(self.outage_since + self.limit - now, 0.0))
        log.warning(
            "worker %s: the database is unavailable (%s); trying again in %.1f s",
            self.worker.worker_id,
            exc,
            self.outage_wait,
        )
        self.worker._stopping.wait(self.outage_wait)
        return True

    def _hand_back_carried(self) -> None:
        """Give back a job claimed with the last run's end that this loop will not run."""
        worker = self.worker
        request = self.carried.request if self.carried is not None else None
        if request is not None and request.made:
            unrun = worker._claim_of(request.claimed, request.attempt_id, request.now)
            if unrun is not None:  # claimed with the last run's end: never started
                lease = Lease(worker.store, unrun, worker.lease_seconds, time.time())
                worker._hand_back(lease, untouched=True)


class _NextClaims:
    """What a claim loop gives its run to make the loop's next claim with (``Claim.next_claim``,
    called as the transaction that ends the job is written): the claim :meth:`Worker._next_claim`
    makes then — the jobs to skip, the time and the attempt id as they are at that moment — or
    none when the loop or the worker is stopping. :attr:`request`: the claim made, if one was."""

    __slots__ = ("_stop", "_worker", "request")

    def __init__(self, worker: Worker, stop: threading.Event) -> None:
        self._worker = worker
        self._stop = stop
        self.request: NextClaim | None = None

    def __call__(self) -> NextClaim | None:
        if self.request is None and not (
            self._stop.is_set() or self._worker.stopping or not self._worker.queue_claims.default
        ):
            self.request = self._worker._next_claim()
        return self.request
