"""A worker frozen between T1 and the tool call — a real process stopped with SIGSTOP, every
thread and so every heartbeat with it — confirms its lease when it thaws, before it acts:

* if the job was reclaimed meanwhile, it does not call the tool (before the lease was confirmed
  it did, and the world saw the effect twice);
* if the lease ran out but nobody reclaimed the job, it takes the lease back and goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime, StoreError, StoreUnavailable
from affidavit.runtime._lease import Lease
from affidavit.runtime._worker import Worker
from tests.runtime.crash_tools import REGISTRY, read_side
from tests.runtime.helpers import (
    assert_log_sound,
    ledger_rows,
    spawn_driver,
    wait_lease_expired,
    write_lock_free,
)

STOP = "tool.after_acquire"  # T1 committed, the tool not called yet
# The driver's lease: its first heartbeat comes a third of it after the claim, long after the
# run reaches the stop point, so the frozen process holds no transaction (checked below).


def plan(tool_name: str) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "pay",
                "type": "tool",
                "tool": tool_name,
                "args": {"side": "${input.side}", "amount": 5},
            }
        ]
    }


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 30) -> None:
    """Wait until ``proc`` has stopped itself (state ``T`` in /proc)."""
    end = time.monotonic() + timeout
    while True:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "T":
            return
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the worker did not reach its stop point"
        time.sleep(0.01)


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Thaw ``proc`` and return its JSON summary."""
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


@pytest.mark.parametrize("tool_name", ["crash_charge", "crash_charge_nr"])
def test_thawed_worker_does_not_act_after_a_takeover(
    store_url: str, tmp_path: Path, tool_name: str
) -> None:
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(plan(tool_name), {"side": str(side)}).job_id
        proc = spawn_driver(store_url, "--job", job_id, "--lease", "1.5", stop=STOP)
        try:
            wait_stopped(proc)
            assert write_lock_free(store_url, job_id)
            [row] = ledger_rows(rt.store, job_id)
            assert row.status == "started"  # T1 is in; the frozen worker holds the invocation
            frozen_attempt = rt.get_job(job_id).attempt_id
            wait_lease_expired(rt.store, job_id)
            assert rt.run_until_idle() == 1  # the takeover
            job = rt.get_job(job_id)
            assert job.attempt_id != frozen_attempt
            events = rt.store.list_events(job_id)
            ledger = ledger_rows(rt.store, job_id)
        finally:
            summary = finish(proc)
        assert summary["status"] == "lost"
        effects = read_side(side)
        assert [e["pid"] for e in effects if e["pid"] == proc.pid] == []  # it never called
        if tool_name == "crash_charge":
            # reconcile found nothing (the frozen worker had not acted): paid once, here
            assert job.status == "completed"
            assert [e["pid"] for e in effects] == [os.getpid()]
        else:
            # nobody can tell whether the frozen call acted: parked, and it never did
            assert job.status == "parked"
            assert effects == []
        # ... and it wrote nothing after thawing
        assert rt.store.list_events(job_id) == events
        assert ledger_rows(rt.store, job_id) == ledger
        assert_log_sound(rt.store, job_id)


def test_thawed_worker_takes_back_a_lease_nobody_reclaimed(store_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(plan("crash_charge"), {"side": str(side)}).job_id
        proc = spawn_driver(store_url, "--job", job_id, "--lease", "1.5", stop=STOP)
        try:
            wait_stopped(proc)
            wait_lease_expired(rt.store, job_id)
        finally:
            summary = finish(proc)
        assert summary["status"] == "completed"
        assert [e["pid"] for e in read_side(side)] == [proc.pid]  # it acted, once
        job = rt.get_job(job_id)
        assert job.status == "completed"
        events = assert_log_sound(rt.store, job_id)
        assert [e.type for e in events].count("node_started") == 1  # one attempt, not retried


class _Unreachable:
    """A store whose every transaction fails."""

    def __init__(self, error: StoreError) -> None:
        self.error = error

    def transaction(self, *, durable: bool = True) -> Any:
        raise self.error


def test_lease_confirm_decisions(store_url: str) -> None:
    """:meth:`Lease.confirm` on a clock the test moves: within the margin it needs no
    database; past it, it renews (and learns the lease was lost if another attempt holds the
    job); an unreachable database is never taken for a held lease."""
    with Runtime(store_url, tools=REGISTRY, lease_seconds=30) as rt:
        job_id = rt.submit(plan("crash_charge"), {"side": "unused"}).job_id
        claim = Worker(rt.store, REGISTRY, lease_seconds=30).claim(job_id)
        assert claim is not None and claim.lease_expires_at is not None
        now = [claim.lease_expires_at - 30]
        lease = Lease(rt.store, claim, 30, claim.lease_expires_at, clock=lambda: now[0])
        assert lease.confirm()  # fresh: no renewal needed
        now[0] += 25  # 5 s left, less than a third of the lease
        assert lease.confirm()  # renewed
        assert lease.expires_at == pytest.approx(now[0] + 30)
        assert rt.get_job(job_id).lease_expires_at == pytest.approx(now[0] + 30)

        def failing(error: StoreError) -> Lease:  # the same lease, when renewing fails
            store: Any = _Unreachable(error)
            return Lease(store, claim, 30, lease.expires_at, clock=lambda: now[0] + 25)

        broken = failing(StoreError("no such table"))
        assert not broken.confirm() and not broken.lost.is_set()
        offline = failing(StoreUnavailable("the database is unreachable"))
        with pytest.raises(StoreUnavailable):  # not known either way: the caller asks again
            offline.confirm()
        assert not offline.lost.is_set()
        # another worker reclaims the job (its lease is made to look expired)
        with rt.store.transaction() as tx:
            tx.set_lease(job_id, attempt_id=claim.attempt_id, owner="w", expires_at=0.0)
        other = Worker(rt.store, REGISTRY, lease_seconds=30).claim(job_id)
        assert other is not None
        now[0] += 25
        assert not lease.confirm() and lease.lost.is_set()
        assert not lease.confirm()  # lost stays lost, without asking the database


class _Recording:
    """A store that records the durability each transaction asks for."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.durable: list[bool] = []

    def transaction(self, *, durable: bool = True) -> Any:
        self.durable.append(durable)
        return self.store.transaction(durable=durable)


def test_a_renewal_is_durable(store_url: str) -> None:
    """A run calls a tool on the strength of its last renewal with no durable commit in
    between: a renewal the database could lose in a crash would let another worker reclaim the
    job meanwhile. So renewals commit durably (a release need not: losing one only delays the
    next claim)."""
    with Runtime(store_url, tools=REGISTRY, lease_seconds=30) as rt:
        job_id = rt.submit(plan("crash_charge"), {"side": "unused"}).job_id
        claim = Worker(rt.store, REGISTRY, lease_seconds=30).claim(job_id)
        assert claim is not None and claim.lease_expires_at is not None
        store = _Recording(rt.store)
        lease = Lease(store, claim, 30, claim.lease_expires_at)  # type: ignore[arg-type]
        assert lease.renew()
        assert store.durable == [True]
        assert lease.release()
        assert rt.get_job(job_id).lease_expires_at <= time.time()
