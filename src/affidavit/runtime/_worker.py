"""Workers: claim runnable jobs, hold their lease with heartbeats, run them.

A job is runnable when it is ``pending``, or ``running`` with an expired lease (its worker
died): claiming it gives it a new attempt id, which fences off every write of the old one.
SQLite claims inside ``BEGIN IMMEDIATE``; PostgreSQL with ``FOR UPDATE SKIP LOCKED``, so any
number of workers on any number of machines share one database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection

from affidavit.core.config import DEFAULT_LEASE_SECONDS as DEFAULT_LEASE_SECONDS
from affidavit.core.errors import ClockSkewError, StoreError, StoreUnavailable
from affidavit.core.ids import new_attempt_id
from affidavit.record import Sealer
from affidavit.runtime._claim_loop import OUTAGE_FIRST_WAIT, OUTAGE_MAX_WAIT, ClaimLoop, LoopEnds
from affidavit.runtime._lease import Heartbeats, Lease
from affidavit.runtime._limits import declare_limits
from affidavit.runtime._metrics import RuntimeMetrics
from affidavit.runtime._queues import QueueClaims
from affidavit.runtime._run_base import (
    DEFAULT_MAX_RECOVERIES,
    DEFAULT_STORE_RETRY_SECONDS,
    Claim,
    StopAwareSleep,
)
from affidavit.runtime._runner import JobRunner
from affidavit.runtime._sdk import ToolRegistry
from affidavit.store import Claimed, ClockOffset, NextClaim, Store, open_store

# How many jobs a worker remembers not to claim because it lacks their tools.
_MAX_SKIPPED = 1000
log = logging.getLogger("affidavit.worker")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident() % 100000}"


def open_store_waiting(
    url: str,
    *,
    max_outage_seconds: float | None = None,
    stop: threading.Event | None = None,
    worker_id: str = "",
    connections: int = 1,
) -> Store:
    """Open (connect, pool, migrations) the database at ``url`` as a worker starts: while it
    is unavailable — down, restarting, refusing connections, ending sessions mid-migration —
    wait and try again as a worker's claim loops do (0.5 s, doubling, up to 5 s between
    tries), until it is back or, with ``max_outage_seconds``, until it has been unavailable
    that long. A migration that a restart cut off was rolled back and is applied again.
    ``connections``: as :func:`~affidavit.store.open_store`'s.

    Raises:
        StoreUnavailable: still unavailable after ``max_outage_seconds``, or ``stop`` was set
            while waiting.
        StoreError: any other failure to open it (a bad password, no such database, a schema
            newer than this affidavit): no wait undoes those.
    """
    if max_outage_seconds is not None and not max_outage_seconds >= 0:
        raise ValueError("max_outage_seconds must not be negative")
    stop = stop or threading.Event()
    since = time.monotonic()
    wait = 0.0
    while True:
        try:
            store = open_store(url, connections=connections)
        except StoreUnavailable as exc:
            now = time.monotonic()
            limit = max_outage_seconds
            if stop.is_set() or (limit is not None and now - since >= limit):
                raise StoreUnavailable(
                    f"the database was unavailable for {now - since:.1f} s when the worker "
                    f"started; the worker gave up ({exc.message})",
                    hint=exc.hint,
                ) from exc
            wait = min(max(2 * wait, OUTAGE_FIRST_WAIT), OUTAGE_MAX_WAIT)
            if limit is not None:
                wait = min(wait, max(since + limit - now, 0.0))
            log.warning(
                "worker %s: the database is unavailable at start (%s); trying again in %.1f s",
                worker_id,
                exc,
                wait,
            )
            stop.wait(wait)
            continue
        if wait:
            log.warning("worker %s: the database is reachable again", worker_id)
        return store


def allowed_clock_offset(lease_seconds: float) -> float:
    """How far a worker's clock may be off the database server's for a lease of
    ``lease_seconds`` (see :func:`clock_problem`)."""
    return lease_seconds / 6


def clock_problem(reading: ClockOffset | None, lease_seconds: float) -> str:
    """What is wrong with this host's clock for a lease of ``lease_seconds``, given how far it
    is from the database server's (``""``: nothing; ``None`` reading: one host, one clock).
    Workers judge each other's leases by their own clocks, and a worker confirms its own before
    a tool call with a third of the lease to spare: two workers' clocks may differ by at most a
    third of the lease, so each may be a sixth of it off the server's, beyond the reading's
    uncertainty."""
    allowed = allowed_clock_offset(lease_seconds)
    if reading is None or abs(reading.offset) - reading.uncertainty <= allowed:
        return ""
    return (
        f"this host's clock is {-reading.offset:+.2f} s off the database server's "
        f"(± {reading.uncertainty * 1000:.1f} ms); with a lease of {lease_seconds:g} s a "
        f"worker's clock may be at most {allowed:.2f} s off, so that no two workers' clocks "
        f"differ by more than a third of the lease"
    )


class Worker:
    """Claims and runs jobs. Thread-safe: ``run(concurrency=N)`` runs N claim loops (N jobs at
    once); ``step_concurrency`` runs up to that many independent nodes of one job at once."""

    def __init__(
        self,
        store: Store,
        tools: ToolRegistry,
        *,
        worker_id: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        poll_seconds: float = 0.5,
        sleep: Callable[[float], None] | None = None,
        metrics: RuntimeMetrics | None = None,
        step_concurrency: int = 1,
        sealer: Sealer | None = None,
        on_job: Callable[[str, str, float], None] | None = None,
        store_retry_seconds: float = DEFAULT_STORE_RETRY_SECONDS,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
        max_outage_seconds: float | None = None,
        queues: Collection[str] | None = None,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        if max_recoveries < 0:
            raise ValueError("max_recoveries must not be negative")
        # recoveries in a row without progress after which a job is parked, not run
        self.max_recoveries = max_recoveries
        if step_concurrency < 1:
            raise ValueError("step_concurrency must be ≥ 1")
        if store_retry_seconds < 0:
            raise ValueError("store_retry_seconds must not be negative")
        if max_outage_seconds is not None and not max_outage_seconds >= 0:
            raise ValueError("max_outage_seconds must not be negative")
        # how long run() keeps waiting for an unavailable database before it gives up (None:
        # until the database is back)
        self.max_outage_seconds = max_outage_seconds
        self.step_concurrency = step_concurrency
        # how long a run keeps trying a write while the database is unavailable, so that a
        # restart or failover does not leave a step between its tool call and its record
        self.store_retry_seconds = store_retry_seconds
        self.store = store
        self.tools = tools
        # the queues this worker claims from (None: every queue; see runtime/_queues.py)
        self.queue_claims = QueueClaims(store, queues)
        self.worker_id = worker_id or default_worker_id()
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        # how a run waits between attempts of a step; by default a wait that request_stop
        # cuts short
        self._stopping = threading.Event()
        self._sleep = sleep if sleep is not None else StopAwareSleep(self._stopping)
        self.metrics = metrics if metrics is not None else RuntimeMetrics()
        self.sealer = sealer if sealer is not None else Sealer.for_store(store)
        # called after each run with (job id, resulting status, seconds the run took); the
        # status is "lost" when the run was fenced off, "released" when it was handed back by a
        # stopping worker (see request_stop)
        self.on_job = on_job
        # called with (job id, version at claim) after a commit that finished a step
        self.on_step: Callable[[str, int], None] | None = None
        self._count_lock = threading.Lock()
        self._heartbeats = Heartbeats()
        self.jobs_run = 0
        # jobs this worker handed back because it lacks tools they need: not claimed again by
        # it (insertion-ordered, the oldest forgotten past _MAX_SKIPPED)
        self._cannot_run: dict[str, None] = {}
        self._clock_checked = False  # see check_clock
        # what the last job handed back as unrunnable needed (tools, an agent's version)
        self.last_missing: list[str] = []

    def request_stop(self) -> None:
        """Stop gracefully: claim nothing more, and end every running job at its next step
        boundary — after the step that is running has recorded its outcome, never between a
        tool call and its commit — then give the job's lease back, so that another worker can
        take it over at once. :meth:`run` returns when every job has been handed back (a
        step that is running is not interrupted: the wait is as long as that step). Jobs a
        stopping worker gives back end their run as ``released``."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`request_stop` was called."""
        return self._stopping.is_set()

    def check_clock(self) -> None:
        """Check, once per worker, that this host's clock is close enough to a shared database
        server's for the lease (:func:`clock_problem`). Nothing to check where the database is
        on this host (SQLite). The first claim checks, if nothing did before.

        Raises:
            ClockSkewError: the clock is further off (beyond the reading's uncertainty).
        """
        if self._clock_checked:
            return
        problem = clock_problem(self.store.clock_offset(), self.lease_seconds)
        if problem:
            raise ClockSkewError(problem)
        self._clock_checked = True

    def claim(self, job_id: str | None = None) -> Claim | None:
        """Claim one runnable job (or the given one, if runnable).

        Raises:
            ClockSkewError: see :meth:`check_clock`.
            SealKeyRefused: the database does not accept this worker's seal key (checked once,
                before the first claim: see :meth:`Sealer.admit`).
        """
        self.check_clock()
        self.sealer.admit(self.store)
        attempt = new_attempt_id()
        now = time.time()
        with self._count_lock:
            skip = () if job_id is not None else tuple(self._cannot_run)
        # Not waited to disk: nothing acts on a claim alone. The run's first durable commit
        # (T1 before any tool acts, or the job's end) makes it durable first, the log being
        # ordered; a claim lost with the database's last moments leaves the job claimable
        # again, and the run's writes under it fenced off (their attempt is not the job's).
        claimed = None
        if self.queue_claims.default:
            claimed = self.store.claim(
                owner=self.worker_id,
                attempt_id=attempt,
                now=now,
                lease_seconds=self.lease_seconds,
                job_id=job_id,
                skip=skip,
                with_log=True,
            )
        if claimed is None:
            claimed = self.queue_claims.claim(
                owner=self.worker_id,
                attempt_id=attempt,
                now=now,
                lease_seconds=self.lease_seconds,
                job_id=job_id,
                skip=skip,
            )
        return self._claim_of(claimed, attempt, now)

    def _claim_of(self, claimed: Claimed | None, attempt: str, now: float) -> Claim | None:
        if not claimed:
            return None
        return Claim(
            claimed.job_id,
            attempt,
            self.worker_id,
            now + self.lease_seconds,
            claimed.recovered,
            claimed.recoveries,
            claimed.progress,
            claimed.log,
        )

    def _next_claim(self) -> NextClaim:
        """The claim a run sends with the transaction that ends its job (see
        :class:`~affidavit.store.NextClaim`), as :meth:`claim` would make it now."""
        with self._count_lock:
            skip = tuple(self._cannot_run)
        return NextClaim(
            self.worker_id, new_attempt_id(), time.time(), self.lease_seconds, skip, True
        )

    def _carried(self, request: NextClaim | None) -> tuple[bool, Claim | None]:
        """Whether ``request`` was made with the last run's end, and the claim it made.

        Its lease runs from that end, while heartbeats start with the run: when the last run
        took long to return after its end (an agent's calls still running when it parked, a
        slow ``on_job``), the lease is renewed first, as a heartbeat would have renewed it; a
        lease lost meanwhile (it ran out and another worker took the job) is no claim.

        Raises:
            StoreError: the renewal could not be written (the job is taken up again when its
                lease runs out, as after any claim lost so).
        """
        if request is None or not request.made:
            return False, None
        claim = self._claim_of(request.claimed, request.attempt_id, request.now)
        if claim is None or time.time() - request.now < self.lease_seconds / 3:
            return True, claim
        lease = Lease(self.store, claim, self.lease_seconds, request.now + self.lease_seconds)
        if not lease.renew():
            return False, None  # lost: claim the usual way
        return True, dataclasses.replace(claim, lease_expires_at=lease.expires_at)

    def _hand_back(self, lease: Lease, *, untouched: bool) -> None:
        """Give the job of ``lease`` back (see :meth:`Lease.release`); one that cannot be
        given back keeps its lease until it expires."""
        try:
            lease.release(untouched=untouched)
        except StoreError:
            log.warning(
                "worker %s: job %s keeps its lease until it expires",
                self.worker_id,
                lease.job_id,
            )

    def run_claim(self, claim: Claim) -> str:
        """Run a claimed job while a heartbeat thread keeps its lease alive; the run confirms
        the lease before every tool call (:class:`~affidavit.runtime._lease.Lease`)."""
        expires_at = claim.lease_expires_at
        lease = Lease(
            self.store,
            claim,
            self.lease_seconds,
            expires_at if expires_at is not None else time.time(),  # unknown: renew first
        )
        runner = JobRunner(
            self.store,
            self.tools,
            lease=lease,
            sleep=self._sleep,
            metrics=self.metrics,
            step_concurrency=self.step_concurrency,
            sealer=self.sealer,
            stopping=self._stopping,
            store_retry_seconds=self.store_retry_seconds,
            max_recoveries=self.max_recoveries,
        )
        runner.on_step = self.on_step
        heart = self._heartbeats.keep(lease, self.lease_seconds / 3)
        started = time.perf_counter()
        status = "error"
        try:
            status = runner.run(claim)
        finally:
            heart.stop()
            with self._count_lock:
                if status != "unrunnable":
                    self.jobs_run += 1
        if status == "unrunnable":
            self.last_missing = list(runner.missing_tools)
            # nothing was written: hand the job back at once, for a worker with these tools
            log.warning(
                "worker %s: job %s needs %s, which this worker does not have (--tools); "
                "handed back for another worker",
                self.worker_id,
                claim.job_id,
                ", ".join(runner.missing_tools),
            )
            with self._count_lock:
                self._cannot_run[claim.job_id] = None
                while len(self._cannot_run) > _MAX_SKIPPED:
                    del self._cannot_run[next(iter(self._cannot_run))]
        if status in ("released", "unrunnable"):
            # a job this worker cannot run is handed back as it was claimed: a recovered one
            # stays recovered, for the worker that runs it to count
            self._hand_back(lease, untouched=status == "unrunnable")
        if self.on_job is not None:
            self.on_job(claim.job_id, status, time.perf_counter() - started)
        return status

    def run_once(self, job_id: str | None = None) -> str | None:
        """Claim and run one job; ``None`` if nothing was runnable."""
        # A key that cannot be loaded or created must stop us before a job acts, not when it
        # is about to be sealed (and the claim admits it to the database first).
        self.sealer.key()
        if self._stopping.is_set():
            return None
        claim = self.claim(job_id)
        return self.run_claim(claim) if claim else None

    def _still_leased(self, job_id: str, attempt_id: str) -> bool:
        """Whether the job a run of ours gave up on still waits for that run's lease to
        expire (no other worker took it, it did not end, the lease has not run out)."""
        job = self.store.get_job(job_id)
        expires_at = job.lease_expires_at
        return (
            job.status == "running"
            and job.attempt_id == attempt_id
            and expires_at is not None
            and expires_at > time.time()
        )

    def run(
        self,
        *,
        until_idle: bool = False,
        concurrency: int = 1,
        stop: threading.Event | None = None,
    ) -> int:
        """Run claim loops until ``stop`` is set (or, with ``until_idle``, until no job is
        runnable); return how many jobs were run.

        While the database is unavailable the loops wait and try again (0.5 s, doubling, up to
        5 s between tries), by default until it is back.

        Raises:
            StoreUnavailable: ``max_outage_seconds`` is set and a loop found the database
                unavailable for that long in a row (every claim failing, or every run it
                claimed giving up, since it first found it so). The other loops stop claiming and
                finish what they run first; the jobs of runs that gave up keep their leases
                until those expire, as after a crash.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be ≥ 1")
        # An unusable signing key, or one the database does not accept, stops the worker here:
        # the loops below survive job errors. So does a clock too far off the database
        # server's (both checked at the first claim when the database is unavailable now).
        self.sealer.key()
        with contextlib.suppress(StoreUnavailable):
            self.check_clock()
            self.sealer.admit(self.store)  # (else at the first claim)
            declare_limits(self.store, self.tools)  # one declaration per limit name
        stop = stop or threading.Event()
        ends = LoopEnds()
        threads = [
            threading.Thread(
                target=ClaimLoop(self, stop, until_idle, ends).run,
                name=f"worker-{i}",
                daemon=True,
            )
            for i in range(concurrency - 1)
        ]
        for t in threads:
            t.start()
        ClaimLoop(self, stop, until_idle, ends).run()
        for t in threads:
            t.join()
        if ends.refused:
            raise ends.refused[0]
        if ends.claim_failed:
            raise ends.claim_failed[0]
        if ends.gave_up:
            first = ends.gave_up[0]
            raise StoreUnavailable(
                f"the database was unavailable for {self.max_outage_seconds:g} s or more; "
                f"the worker gave up ({first.message})",
                hint=first.hint,
            ) from first
        return self.jobs_run
