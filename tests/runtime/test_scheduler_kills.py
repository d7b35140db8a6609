"""Exactly one job per slot with real ``affidavit worker`` processes that are killed at random
(SIGKILL: no lease given back, a tick or a job cut anywhere), on both backends, and across a
restart of the database (a private PostgreSQL server of the test's own). Everything is checked
from the jobs table and the effects file, not from the scheduler's own bookkeeping: each slot's
key names one job, no slot between the first and the last is missing (``--catch-up all``),
every job completed with its one effect, and every job verifies."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.runtime import add_schedule, check_timing, list_runs
from affidavit.runtime._schedule_slots import iso_slot
from affidavit.store import Store, open_store
from affidavit.verify import verify_job
from tests.conftest import examples
from tests.pg_cluster import PrivateCluster, private_cluster_or_skip
from tests.runtime.sched_tools import REGISTRY, effects

ROOT = Path(__file__).resolve().parents[2]
LEASE = "1"  # the workers' (and so their schedulers') lease, in seconds


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    yield from private_cluster_or_skip()


def _worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AFFIDAVIT_SCHEDULER_INTERVAL": "0.1",
        "AFFIDAVIT_MAX_OUTAGE_SECONDS": "120",
    }
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "affidavit", "worker", "--db", url, "--tools",
             "tests.runtime.sched_tools", "--lease-seconds", LEASE],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )  # fmt: skip


def _schedule(url: str, where: Path) -> int:
    store = open_store(url)
    try:
        row = add_schedule(
            store,
            "pulse",
            check_timing(None, "1s", None),
            agent="sched_agent",
            tools=REGISTRY,
            input={"dir": str(where)},
            catch_up="all",
        )
    finally:
        store.close()
    return row.anchor


def _fired(url: str) -> int:
    store = open_store(url)
    try:
        return len(list_runs(store, "pulse", limit=10_000))
    finally:
        store.close()


def _run_with_kills(
    url: str, tmp_path: Path, seconds: float, at_least: int, rng: random.Random
) -> None:
    """Three workers for ``seconds`` (and until ``at_least`` slots fired, within two minutes:
    the machine may be slow to start a worker), one of them SIGKILLed and replaced every
    0.3-1.2 s, each after it lived a second at least (else a loaded machine might kill every
    worker before its first tick)."""
    log = tmp_path / "workers.log"
    workers = [(_worker(url, log), time.monotonic()) for _ in range(3)]
    start = time.monotonic()
    try:
        while time.monotonic() - start < seconds or _fired(url) < at_least:
            assert time.monotonic() - start < 120, log.read_text()[-3000:]
            time.sleep(rng.uniform(0.3, 1.2))
            old = [i for i, (_, born) in enumerate(workers) if time.monotonic() - born >= 1.0]
            if not old:
                continue
            victim = rng.choice(old)
            workers[victim][0].send_signal(signal.SIGKILL)
            workers[victim][0].wait(timeout=30)
            workers[victim] = (_worker(url, log), time.monotonic())
    finally:
        for w, _ in workers:
            w.send_signal(signal.SIGKILL)
            w.wait(timeout=30)


def _check(store: Store, anchor: int, where: Path, at_least: int) -> None:
    with store.transaction(durable=False) as tx:
        rows = tx.query(
            "SELECT idempotency_key, COUNT(*) FROM jobs WHERE idempotency_key LIKE ? "
            "GROUP BY idempotency_key",
            ("schedule:pulse:%",),
        )
    assert rows and all(n == 1 for _, n in rows), [r for r in rows if r[1] != 1]
    keys = sorted(k for k, _ in rows)
    last = anchor + len(keys)
    # no slot missing from the first after the schedule was added to the last fired
    assert keys == [f"schedule:pulse:{iso_slot(s)}" for s in range(anchor + 1, last + 1)]
    assert len(keys) >= at_least
    runs = list_runs(store, "pulse", limit=10_000)
    assert len(runs) == len(keys)
    # the jobs killed mid-run are taken up again: finish them here
    time.sleep(float(LEASE) + 0.2)
    Runtime(store=store, tools=REGISTRY).run_until_idle()  # (the store is closed by the caller)
    done = Counter(e["job"] for e in effects(where))
    for r in runs:
        job = store.get_job(r["job_id"])
        assert job.status == "completed", (r, job.status)
        assert done[r["job_id"]] == 1, r  # the effect once
        assert verify_job(store, r["job_id"]).ok
    assert sum(done.values()) == len(runs)


def test_killed_workers_fire_each_slot_once(store_url: str, tmp_path: Path) -> None:
    rng = random.Random(46)
    anchor = _schedule(store_url, tmp_path)
    seconds = examples(6, 60)
    _run_with_kills(store_url, tmp_path, seconds, 5, rng)
    # every slot up to the last fired, whatever the kills cut
    store = open_store(store_url)
    try:
        _check(store, anchor, tmp_path, at_least=5)
    finally:
        store.close()


def test_each_slot_fires_once_across_a_database_restart(
    cluster: PrivateCluster, tmp_path: Path
) -> None:
    url = cluster.create_database("jobs")
    anchor = _schedule(url, tmp_path)
    log = tmp_path / "workers.log"
    workers = [_worker(url, log) for _ in range(2)]
    try:
        time.sleep(3)
        cluster.restart("immediate")  # as a crash of the server
        time.sleep(2)
        cluster.restart("fast")
        time.sleep(4)
    finally:
        for w in workers:
            w.send_signal(signal.SIGKILL)
            w.wait(timeout=30)
    assert "reachable again" in log.read_text()
    store = open_store(url)
    try:
        _check(store, anchor, tmp_path, at_least=6)
    finally:
        store.close()
