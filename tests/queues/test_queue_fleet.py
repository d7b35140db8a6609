"""Three worker processes on one queue with limits, killed at random (SIGKILL) and replaced.

Checked from what was recorded, not from the limiter's counts: the tool's own timestamps (its
start and end lines, a killed call ending at the kill) never show more calls at once than the
queue's concurrency; the claims' recorded times (queue_grants) never put more starts in a
window than the rate; every job's effect happened once; every job completed and verifies.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from affidavit import Runtime
from affidavit.core.rates import Rate, worst_window
from affidavit.store import JobFilter
from affidavit.store.queue_grants import queue_grants
from affidavit.store.queues import queue_config, recorded_grants, set_queue
from affidavit.verify import verify_job
from affidavit.verify.queue_limits import verify_queue
from tests.queues.queue_tools import REGISTRY, hold_plan
from tests.runtime.crash_tools import read_side
from tests.runtime.helpers import driver_env

DRIVER = Path(__file__).with_name("queue_driver.py")
LEASE = 2.0
CONCURRENCY = 2
RATE = Rate(4, 1.0)


def spawn(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(DRIVER),
            url,
            "--lease",
            str(LEASE),
            "--concurrency",
            "3",
            "--queue",
            "fleet",
            "--deadline",
            "90",
        ],
        env=driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = worst = 0
    for _, step in points:  # an end before a start at the same instant
        now += step
        worst = max(worst, now)
    return worst


def test_fleet_keeps_the_limits_through_kills(store_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    n_jobs = 12
    with Runtime(store_url, tools=REGISTRY) as rt:
        set_queue(rt.store, queue_config("fleet", concurrency=CONCURRENCY, rate=str(RATE)))
        job_ids = [
            rt.submit(hold_plan(), {"side": str(side), "seconds": 0.3}, queue="fleet").job_id
            for _ in range(n_jobs)
        ]
        started = time.time()
        procs = [spawn(store_url) for _ in range(3)]
        killed_at: dict[int, float] = {}
        for _ in range(2):  # kill a worker that holds a call, and start another
            end = time.monotonic() + 30
            while True:
                lines = read_side(side)
                busy = {x["pid"] for x in lines if x["kind"] == "start"} - {
                    x["pid"] for x in lines if x["kind"] == "end"
                }
                live = [p for p in procs if p.poll() is None and p.pid in busy]
                if live or time.monotonic() > end:
                    break
                time.sleep(0.01)
            if not live:
                break
            victim = random.choice(live)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed_at[victim.pid] = time.time()
            procs.append(spawn(store_url))
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode in (0, -signal.SIGKILL), err

        lines = read_side(side)
        starts = {x["key"]: x for x in lines if x["kind"] == "start"}
        ends = {x["key"]: x["t"] for x in lines if x["kind"] == "end"}
        # every job's effect once
        assert Counter(x["job"] for x in lines if x["kind"] == "start") == dict.fromkeys(job_ids, 1)
        intervals = [
            (x["t"], ends.get(key, killed_at.get(x["pid"], float("inf"))))
            for key, x in starts.items()
        ]
        assert all(e < float("inf") for _, e in intervals)  # no call without an end or a kill
        assert max_overlap(intervals) <= CONCURRENCY
        grants = recorded_grants(rt.store, "fleet", started - 60)
        worst, _ = worst_window(RATE, [g["claimed_at"] for g in grants if g["started"]])
        assert worst <= RATE.count
        assert sorted({g["job_id"] for g in grants if g["started"]}) == sorted(job_ids)
        jobs = rt.store.list_jobs(JobFilter(limit=n_jobs + 5))
        assert Counter(j.status for j in jobs) == {"completed": n_jobs}
        for job_id in job_ids:
            assert verify_job(rt.store, job_id).ok
        # the same from the grants and their recorded ends alone (a killed worker's claims
        # end at their leases' expiry): no window over the rate, no instant over concurrency
        proof = verify_queue(rt.store, "fleet", started - 1, time.time())
        assert proof.rate is not None and proof.rate.ok, proof.to_dict()
        assert proof.starts == n_jobs and not proof.unknown
        # holds run from the database's clock after each claim's lock to their recorded
        # ends: a slot handed from an ending job to the next claim never reads as held twice
        assert proof.concurrency is not None and proof.concurrency.ok, proof.to_dict()
        assert proof.concurrency.worst >= 1
        if killed_at:
            assert any(
                g.ended_as == "lease_expired"
                for g in queue_grants(rt.store, "fleet", started - 1, 0.0, time.time())
            )
        print(f"killed {len(killed_at)}; overlap {max_overlap(intervals)}; worst window {worst}")
