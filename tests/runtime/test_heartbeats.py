"""A worker's heartbeats (runtime/_lease.py, ``Heartbeats``): one helper thread per job in
progress, kept for the next job; renewals stop when the run's helper is stopped; an idle helper
ends. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from affidavit import Runtime, StoreUnavailable, Tool, ToolRegistry
from affidavit.runtime._lease import Heartbeats, Lease
from affidavit.runtime._worker import Worker
from tests.runtime.crash_tools import REGISTRY, charge_plan


def _claimed_lease(rt: Runtime, seconds: float) -> Lease:
    job_id = rt.submit(charge_plan(), {"side": "unused", "amount": 1}).job_id
    claim = Worker(rt.store, REGISTRY, lease_seconds=seconds).claim(job_id)
    assert claim is not None and claim.lease_expires_at is not None
    return Lease(rt.store, claim, seconds, claim.lease_expires_at)


def _stored_expiry(rt: Runtime, lease: Lease) -> float | None:
    return rt.get_job(lease._claim.job_id).lease_expires_at


def test_a_helper_renews_until_stopped_and_not_after(store_url: str) -> None:
    with Runtime(store_url, tools=REGISTRY) as rt:
        lease = _claimed_lease(rt, 30)
        first = _stored_expiry(rt, lease)
        helper = Heartbeats().keep(lease, 0.05)
        deadline = time.monotonic() + 10
        while _stored_expiry(rt, lease) == first:  # renewed (a later expiry written)
            assert time.monotonic() < deadline, "no renewal"
            time.sleep(0.01)
        helper.stop()  # returns once no renewal is under way
        stopped = _stored_expiry(rt, lease)
        time.sleep(0.3)  # six intervals
        assert _stored_expiry(rt, lease) == stopped


def test_a_worker_reuses_one_helper_for_the_jobs_it_runs_one_after_another(
    store_url: str, tmp_path: Path
) -> None:
    with Runtime(store_url, tools=REGISTRY) as rt:
        for _ in range(5):
            rt.submit(charge_plan(), {"side": str(tmp_path / "side.jsonl"), "amount": 1})
        assert rt.run_until_idle() == 5
        assert len(rt.worker._heartbeats._idle) == 1


def test_an_idle_helper_ends_and_the_next_job_gets_a_new_one(store_url: str) -> None:
    with Runtime(store_url, tools=REGISTRY) as rt:
        pool = Heartbeats()
        pool.idle_seconds = 0.05
        lease = _claimed_lease(rt, 30)
        old = pool.keep(lease, 60)
        old.stop()
        deadline = time.monotonic() + 10
        while not old._ended:
            assert time.monotonic() < deadline, "the idle helper did not end"
            time.sleep(0.01)
        first = _stored_expiry(rt, lease)
        new = pool.keep(lease, 0.05)  # the ended one is passed over
        assert new is not old
        while _stored_expiry(rt, lease) == first:
            assert time.monotonic() < deadline, "no renewal"
            time.sleep(0.01)
        new.stop()


class _Unreachable:
    """A store whose every transaction fails after 10 ms, as while the database is away."""

    def transaction(self, *, durable: bool = True) -> Any:
        time.sleep(0.01)  # (longer than the helper's interval)
        raise StoreUnavailable("test: the database is unreachable")


def test_a_helper_whose_renewals_keep_failing_still_stops(store_url: str) -> None:
    """Renewals that fail (or take longer than the interval) are each followed by a wait, in
    which :meth:`stop` gets in: a run's end is not held up by a database that is away."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        real = _claimed_lease(rt, 30)
    store: Any = _Unreachable()
    lease = Lease(store, real._claim, 30, real.expires_at)
    helper = Heartbeats().keep(lease, 0.001)
    time.sleep(0.05)  # many failed renewals
    stopper = threading.Thread(target=helper.stop)
    stopper.start()
    stopper.join(timeout=10)
    assert not stopper.is_alive(), "stop() is held up by failing renewals"


def test_a_job_starts_with_its_lease_whole_however_long_the_last_one_took_to_return(
    store_url: str,
) -> None:
    """On PostgreSQL a worker's next claim rides on the end of its current job, so its lease
    runs from there; a run that takes long to return after that end (here a slow ``on_job``,
    more than a third of the lease) has the next job's lease renewed before it starts, as a
    heartbeat would have. The next job's tool sees a lease of nearly its whole length ahead.
    (On SQLite the worker claims after the slow return: the same.)"""
    seconds = 3.0
    seen: list[float] = []

    def look(ctx: Any, **_: Any) -> dict[str, Any]:
        expires = rt.get_job(ctx.job_id).lease_expires_at
        assert expires is not None
        seen.append(expires - time.time())
        return {"ok": True}

    tools = ToolRegistry([Tool("look", look, "tool")])
    plan = {"name": "look", "nodes": [{"id": "a", "type": "tool", "tool": "look"}]}
    with Runtime(store_url, tools=tools) as rt:
        rt.submit(plan, {})
        rt.submit(plan, {})
        worker = Worker(rt.store, tools, lease_seconds=seconds)
        worker.on_job = lambda job, status, took: time.sleep(1.5) if not seen[1:] else None
        assert worker.run(until_idle=True) == 2
    assert len(seen) == 2 and min(seen) > seconds - 0.8, seen
