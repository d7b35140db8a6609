"""The scheduler: submits each due slot's job of every schedule, exactly once.

Every worker runs one (``affidavit worker``; ``$AFFIDAVIT_SCHEDULER=off`` turns it off). Each
tick reads the schedules in a snapshot (no write lock); only when a slot is due does it take
the scheduler's lease in ``scheduler_state``, as the log's sequencer does, so one worker at a
time fires slots while the others wait. Exactly once does not rest on the lease: a slot's job
has the idempotency key ``schedule:NAME:SLOT``, which the jobs table holds once per namespace,
so a scheduler that lost its lease while firing, or fires a slot again after a crash between
the job and ``last_slot``, gets the slot's one job back. ``last_slot`` only moves forward.

After an absence (no worker, a database outage) the schedule's ``catch_up`` decides the slots
it missed (see :func:`~affidavit.runtime._schedule_slots.due`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from affidavit.core.errors import AffidavitError, IdempotencyConflict, StoreError, StoreUnavailable
from affidavit.runtime._queues import require_queue
from affidavit.runtime._schedule_slots import Due, due, iso_slot
from affidavit.runtime._schedules import parse_plan, slot_key, slots_of
from affidavit.runtime._sdk import ToolRegistry
from affidavit.runtime._submit import submit_agent_job, submit_job
from affidavit.store import Store
from affidavit.store.queues import placement
from affidavit.store.schedules import (
    ScheduleRow,
    schedule_advance,
    schedule_set_error,
    scheduler_release_lease,
    scheduler_take_lease,
    schedules_read,
)

log = logging.getLogger("affidavit.scheduler")

DEFAULT_INTERVAL_S = 0.5
DEFAULT_LEASE_S = 10.0
SCHEDULER_ENV = "AFFIDAVIT_SCHEDULER"


@dataclass(frozen=True, slots=True)
class Fired:
    """One slot's job: ``created`` is false when the slot had its job already."""

    schedule: str
    slot: str
    job_id: str
    created: bool


@dataclass(slots=True)
class Tick:
    """What one :meth:`Scheduler.tick` did."""

    busy: bool = False  # a slot was due but another scheduler holds the lease
    fired: list[Fired] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # slots left out by catch-up
    errors: dict[str, str] = field(default_factory=dict)


class Scheduler:
    """Fires the due slots of the schedules in ``store``, with the agents of ``tools`` (a plan
    schedule's tools are checked by the worker that runs its job). ``clock``: Unix seconds.

    A slot it cannot submit (an agent ``tools`` lacks) is not recorded as decided: the error
    is kept on the schedule (``schedules list``), the lease given up, and the schedule left to
    other schedulers for a lease's time."""

    def __init__(
        self,
        store: Store,
        tools: ToolRegistry,
        *,
        owner: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        self.store = store
        self.tools = tools
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_seconds = lease_seconds
        self.clock = clock
        # schedules this scheduler could not fire (an agent it lacks) → until when it leaves
        # them to the others
        self._left: dict[str, float] = {}

    def tick(self) -> Tick:
        """Fire every due slot (under the lease, taken only if one is due)."""
        now = self.clock()
        result = Tick()
        if not self._due(now):
            return result
        with self.store.transaction(durable=False) as tx:
            if not scheduler_take_lease(tx, self.owner, now, now + self.lease_seconds):
                result.busy = True
                return result
        for row, decided in self._due(now):  # (read again: the last holder may have fired)
            self._fire(row, decided.fire, decided.skipped, decided.through, result)
        if result.errors:
            # A schedule this worker cannot fire (its agent is not in this worker's --tools):
            # left to the others for a lease's time, and the lease given up so that one of
            # them takes it at its next tick.
            for name in result.errors:
                self._left[name] = now + self.lease_seconds
            self.release()
        return result

    def _due(self, now: float) -> list[tuple[ScheduleRow, Due]]:
        """The schedules with a slot due at ``now``, and what catch-up decides for them."""
        work = []
        for row in schedules_read(self.store):
            if row.paused or self._left.get(row.name, 0.0) > now:
                continue
            after = row.anchor if row.last_slot is None else max(row.anchor, row.last_slot)
            try:
                decided = due(slots_of(row), after, now, row.catch_up)
            except ValueError as exc:  # (a cron date croniter finds no longer: left alone)
                if self._left.get(row.name) is None:
                    log.warning("scheduler: schedule %s has no slot to fire: %s", row.name, exc)
                self._left[row.name] = now + self.lease_seconds
                continue
            if decided.through is not None:
                work.append((row, decided))
        return work

    def _fire(
        self,
        row: ScheduleRow,
        slots: tuple[int, ...],
        skipped: int,
        through: int | None,
        result: Tick,
    ) -> None:
        assert through is not None
        if skipped:
            result.skipped[row.name] = skipped
            log.warning(
                "scheduler: schedule %s missed %d slot(s) up to %s; catch-up %s %s",
                row.name,
                skipped,
                iso_slot(through),
                row.catch_up,
                "fires none of them" if not slots else f"fires {len(slots)}",
            )
        decided: int | None = None
        error: str | None = None
        for slot in slots:
            try:
                fired = self._submit(row, slot)
            except IdempotencyConflict as exc:
                # the key's job is another submission's (a schedule of this name deleted and
                # added again): the slot has its one job
                log.warning("scheduler: schedule %s slot %s: %s", row.name, iso_slot(slot), exc)
                decided = slot
                continue
            except StoreError:
                raise
            except AffidavitError as exc:
                error = f"slot {iso_slot(slot)}: {exc.message}"
                break
            result.fired.append(fired)
            decided = slot
        if error is None and decided is None and not slots:
            decided = through  # every due slot left out by catch-up
        if error is not None:
            result.errors[row.name] = error
            if error != row.last_error:
                log.warning("scheduler: schedule %s cannot fire: %s", row.name, error)
        with self.store.transaction(durable=False) as tx:
            if decided is not None:
                schedule_advance(tx, row.name, decided, skipped=skipped, error=error)
            elif error != row.last_error:
                schedule_set_error(tx, row.name, error)

    def _submit(self, row: ScheduleRow, slot: int) -> Fired:
        key = slot_key(row.name, slot)
        by = f"schedule:{row.name}"
        where = placement(row.queue)  # (None: the default queue)
        if where is not None:
            require_queue(self.store, where.queue)  # (else the error is the schedule's)
        if row.target_kind == "agent":
            job, created = submit_agent_job(
                self.store,
                row.target,
                row.input,
                tools=self.tools,
                idempotency_key=key,
                namespace=row.namespace,
                submitted_by=by,
                placement=where,
            )
        else:
            assert row.plan_text is not None
            job, created = submit_job(
                self.store,
                parse_plan(row.plan_text, row.target),
                row.input,
                tools=None,  # (checked by the worker that runs it)
                idempotency_key=key,
                namespace=row.namespace,
                submitted_by=by,
                placement=where,
            )
        return Fired(row.name, iso_slot(slot), job.job_id, created)

    def release(self) -> None:
        """Give the lease up (a stopping worker), so another scheduler takes over at once."""
        with self.store.transaction(durable=False) as tx:
            scheduler_release_lease(tx, self.owner)

    def run(self, stop: threading.Event, *, interval: float = DEFAULT_INTERVAL_S) -> None:
        """Tick every ``interval`` seconds until ``stop`` is set. Store errors are logged and
        retried; an outage is one warning when it starts and one when it ends."""
        away = False
        while not stop.is_set():
            try:
                self.tick()
                if away:
                    away = False
                    log.warning("scheduler: the database is reachable again")
            except StoreUnavailable as exc:
                (log.debug if away else log.warning)(
                    "scheduler: the database is unavailable (%s); trying again every %g s",
                    exc.message,
                    interval,
                )
                away = True
            except StoreError as exc:
                log.warning("scheduler: %s", exc.message)
            except Exception:
                log.exception("scheduler: a tick failed")
            stop.wait(interval)


def scheduler_enabled() -> bool:
    """Whether workers run the scheduler (``$AFFIDAVIT_SCHEDULER`` is not ``off``)."""
    return os.environ.get(SCHEDULER_ENV, "").lower() not in ("off", "0", "false", "no")


@contextmanager
def background_scheduler(
    store: Store,
    tools: ToolRegistry,
    *,
    lease_seconds: float = DEFAULT_LEASE_S,
    interval: float | None = None,
) -> Iterator[Scheduler | None]:
    """Run a :class:`Scheduler` in a daemon thread while the body runs (a worker: with the
    worker's lease time), ticking every ``interval`` seconds (default
    ``$AFFIDAVIT_SCHEDULER_INTERVAL``, else 0.5); at the end its lease is given up. Nothing
    runs when ``$AFFIDAVIT_SCHEDULER`` is ``off``."""
    if not scheduler_enabled():
        yield None
        return
    if interval is None:
        interval = _interval_from_env()
    scheduler = Scheduler(store, tools, lease_seconds=lease_seconds)
    stop = threading.Event()
    thread = threading.Thread(
        target=scheduler.run,
        args=(stop,),
        kwargs={"interval": interval},
        name="scheduler",
        daemon=True,
    )
    thread.start()
    try:
        yield scheduler
    finally:
        stop.set()
        thread.join()
        try:
            scheduler.release()
        except AffidavitError as exc:
            log.warning("scheduler: could not give its lease up: %s", exc.message)


def _interval_from_env() -> float:
    text = os.environ.get("AFFIDAVIT_SCHEDULER_INTERVAL", "")
    try:
        value = float(text) if text else DEFAULT_INTERVAL_S
    except ValueError:
        value = DEFAULT_INTERVAL_S
    return value if math.isfinite(value) and 0.05 <= value <= 60 else DEFAULT_INTERVAL_S
