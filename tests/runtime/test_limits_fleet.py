"""Three real ``affidavit worker`` processes over jobs whose tool has ``Limit(rate="3/1s",
concurrency=2)``, SIGKILLed at random and replaced, on both backends.

Checked from what was recorded, not from the limiter's counts:

- the tool's own stamps (its start and end lines; a call cut by a kill ends at the kill) never
  show more than 2 calls at once;
- the grants recorded in the events (``limit_grant`` in ``tool_invocation_started``) never put
  more than 3 starts in a second, and never more than 2 grants in flight at once — a grant
  lasting from its time to its call's ``tool_invocation_finished``;
- every job's effect happened once (the side channel: one start line per job), every job
  completed and verifies.

The honest edge: a grant whose worker was killed holding it has no finish of its own (a later
claim reconciles the call and writes the finish). The limiter counted that grant until the dead
claim's lease expired, which the record does not carry; what the record does prove is that the
holder was gone at the kill, so such a grant is counted until the kill — no longer, and no
shorter (a call the kill cut really ran until then).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from affidavit import Runtime
from affidavit.core.rates import parse_rate, worst_window
from affidavit.core.times import parse_iso_us
from affidavit.store import JobFilter, Store
from affidavit.verify import verify_job
from tests.conftest import examples
from tests.runtime.crash_tools import read_side
from tests.runtime.limit_tools import CONCURRENCY, RATE, REGISTRY, hold_plan

ROOT = Path(__file__).resolve().parents[2]
LEASE = "1.5"


def _worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AFFIDAVIT_MAX_OUTAGE_SECONDS": "120"}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "affidavit", "worker", "--db", url, "--tools",
             "tests.runtime.limit_tools", "--lease-seconds", LEASE],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )  # fmt: skip


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = worst = 0
    for _, step in points:  # an end before a start at the same instant
        now += step
        worst = max(worst, now)
    return worst


def _busy(side: Path) -> dict[int, str]:
    """The workers inside a call now: pid -> the job."""
    lines = read_side(side)
    ended = {x["key"] for x in lines if x["kind"] == "end"}
    return {x["pid"]: x["job"] for x in lines if x["kind"] == "start" and x["key"] not in ended}


def _run_with_kills(
    url: str, side: Path, log: Path, kills: int, rng: random.Random
) -> dict[int, float]:
    """Three workers; ``kills`` times, one inside a call is SIGKILLed and replaced. Returns
    the killed pids with the time of their kill."""
    workers = [_worker(url, log) for _ in range(3)]
    killed: dict[int, float] = {}
    try:
        for _ in range(kills):
            end = time.monotonic() + 60
            while time.monotonic() < end:
                busy = _busy(side)
                live = [w for w in workers if w.poll() is None and w.pid in busy]
                if live:
                    break
                time.sleep(0.01)
            else:
                raise AssertionError(log.read_text()[-3000:])
            time.sleep(rng.uniform(0.0, 0.2))  # anywhere in the call, or just after it
            victim = rng.choice(live)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            killed[victim.pid] = time.time()
            workers[workers.index(victim)] = _worker(url, log)
        _until_done(url, log)
    finally:
        for w in workers:
            w.send_signal(signal.SIGKILL)
            w.wait(timeout=30)
    return killed


def _until_done(url: str, log: Path) -> None:
    from affidavit.store import open_store

    store = open_store(url)
    try:
        end = time.monotonic() + 120
        while store.list_jobs(JobFilter(status=["pending", "running"], limit=1)):
            assert time.monotonic() < end, log.read_text()[-3000:]
            time.sleep(0.05)
    finally:
        store.close()


def _grants(store: Store, job_id: str, killed: dict[int, float]) -> list[tuple[float, float]]:
    """The job's recorded grants as (time, end) in seconds: to the call's finish, or to the
    kill of the worker that held it when that came first (the module docstring)."""
    out: list[tuple[float, float]] = []
    holder: int | None = None
    open_: dict[str, tuple[float, int]] = {}
    for e in store.list_events(job_id):
        p: dict[str, Any] = e.payload
        if e.type == "node_started":
            holder = int(str(p["worker_id"]).split(":")[1])
        elif e.type == "tool_invocation_started" and "limit_grant" in p:
            assert holder is not None
            open_[p["invocation_id"]] = (parse_iso_us(p["limit_grant"]["granted_at"]) / 1e6, holder)
        elif e.type == "tool_invocation_finished" and p["invocation_id"] in open_:
            at, pid = open_.pop(p["invocation_id"])
            out.append((at, min(parse_iso_us(p["at"]) / 1e6, killed.get(pid, float("inf")))))
    for at, pid in open_.values():  # never finished: its worker must have been killed
        out.append((at, killed.get(pid, float("inf"))))
    return out


def test_killed_workers_keep_the_limit(store_url: str, tmp_path: Path) -> None:
    rng = random.Random(46)
    side, log = tmp_path / "side.jsonl", tmp_path / "workers.log"
    n_jobs, kills = examples(10, 60), examples(2, 12)
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_ids = [
            rt.submit(hold_plan(), {"side": str(side), "seconds": 0.5}).job_id
            for _ in range(n_jobs)
        ]
        killed = _run_with_kills(store_url, side, log, kills, rng)
        assert len(killed) == kills

        lines = read_side(side)
        # every job's effect once
        assert Counter(x["job"] for x in lines if x["kind"] == "start") == dict.fromkeys(job_ids, 1)
        ends = {x["key"]: x["t"] for x in lines if x["kind"] == "end"}
        calls = [
            (x["t"], ends.get(x["key"], killed.get(x["pid"], float("inf"))))
            for x in lines
            if x["kind"] == "start"
        ]
        assert all(e < float("inf") for _, e in calls)  # every call ended, or was killed
        assert max_overlap(calls) <= CONCURRENCY
        grants = [g for j in job_ids for g in _grants(rt.store, j, killed)]
        assert all(e < float("inf") for _, e in grants), grants
        assert max_overlap(grants) <= CONCURRENCY
        rate = parse_rate(RATE)
        worst, _ = worst_window(rate, [at for at, _ in grants])
        assert worst <= rate.count
        # a kill inside a call: its grant was recorded and counted
        assert len(grants) >= n_jobs
        jobs = rt.store.list_jobs(JobFilter(limit=n_jobs + 5))
        assert Counter(j.status for j in jobs) == {"completed": n_jobs}
        for job_id in job_ids:
            assert verify_job(rt.store, job_id).ok
