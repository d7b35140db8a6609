"""Many worker processes on one database, workers killed with SIGKILL mid-run.

Jobs of three tool steps (s1 → s2 → s3, each a "charge" with a reconcile hook) are run by
several real worker processes (tests/runtime/driver.py ``--until-done``). Workers die by
SIGKILL while holding leases — one at a crash point right after a tool acted, others at random
moments from the test — and their jobs are reclaimed by the survivors once the leases expire.

Checked: every job completed; every (job, step) executed exactly once in the world (the side
channel), including the steps a dead worker left in flight (reconcile found them); the ledger and
the log agree with the world; the log's invariants hold for every job.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.record._replay import build_from_events
from affidavit.store import JobFilter
from tests.conftest import PG_URL, with_schema
from tests.runtime.crash_tools import REGISTRY, counts, read_side, three_tools_plan
from tests.runtime.helpers import assert_log_sound, ledger_rows, spawn_driver

STEPS = ("s1", "s2", "s3")
LEASE = "3"  # long enough that a busy-but-alive worker never loses its lease on 2 cores


def start_worker(url: str, crash: str | None = None) -> subprocess.Popen[str]:
    return spawn_driver(url, "--until-done", "--lease", LEASE, "--deadline", "300", crash=crash)


def executions_by(side: Path, pid: int) -> int:
    return sum(1 for line in read_side(side) if line["pid"] == pid)


def check_fleet_outcome(rt: Runtime, side: Path, job_ids: list[str]) -> dict[str, int]:
    """Every job completed, every step ran exactly once and is recorded as what ran."""
    jobs = rt.store.list_jobs(JobFilter(limit=len(job_ids) + 10))
    assert Counter(j.status for j in jobs) == {"completed": len(job_ids)}
    charged = counts(side, "charge")
    expected = {(job_id, step): 1 for job_id in job_ids for step in STEPS}
    duplicates = {k: n for k, n in charged.items() if n != 1}
    assert not duplicates, f"steps executed more than once: {duplicates}"
    assert dict(charged) == expected
    key_of = {(x["job"], x["node"]): x["key"] for x in read_side(side)}
    stats = Counter[str]()
    for job_id in job_ids:
        events = assert_log_sound(rt.store, job_id)
        rows = ledger_rows(rt.store, job_id)
        assert sorted(r.node_id for r in rows) == list(STEPS)
        for row in rows:
            assert row.status == "committed"
            assert row.result["charge_id"] == key_of[(job_id, row.node_id)]
        replay = build_from_events(events)
        assert replay.status == "completed"
        workers = {e.payload["worker_id"] for e in events if e.type == "node_started"}
        catch_ups = [
            e.payload
            for e in events
            if e.type == "tool_invocation_finished" and e.payload["catch_up"]
        ]
        stats["reclaimed"] += len(workers) > 1
        stats["caught_up"] += sum(1 for c in catch_ups if c["outcome"] == "success")
        stats["lost_then_run"] += sum(1 for c in catch_ups if c["outcome"] == "lost")
    return dict(stats)


def submit_jobs(rt: Runtime, side: Path, n: int) -> list[str]:
    graph = three_tools_plan()
    return [rt.submit(graph, {"side": str(side), "n": i}).job_id for i in range(n)]


def test_four_workers_two_killed(store_url: str, tmp_path: Path) -> None:
    url = store_url
    side = tmp_path / "side.jsonl"
    n_jobs = 200
    with Runtime(url, tools=REGISTRY) as rt:
        job_ids = submit_jobs(rt, side, n_jobs)
        t0 = time.monotonic()
        # worker 0 dies right after its 20th tool call returned, before T2: a step in flight.
        # It gets a head start of 19 calls: the 20th is then step 2 of the job it holds, which
        # no other worker can take from it (started together, SQLite's busy waiting can let
        # the other three claim nearly every job first, so that worker 0 never got to 20).
        procs = [start_worker(url, crash="tool.after_execute:20")]
        end = time.monotonic() + 60
        while executions_by(side, procs[0].pid) < 19:
            assert procs[0].poll() is None, procs[0].communicate()
            assert time.monotonic() < end, "worker 0 made no progress"
            time.sleep(0.01)
        # worker 1 is killed from outside at an arbitrary moment, once it is well into its work.
        # It too starts ahead of the last two: on a fast machine, started together, the others
        # could finish nearly every job before it reached 25 calls (seen once).
        victim = start_worker(url)
        procs.append(victim)
        end = time.monotonic() + 60
        while executions_by(side, victim.pid) < 25:
            assert victim.poll() is None, victim.communicate()
            assert time.monotonic() < end, "worker 1 made no progress"
            time.sleep(0.01)
        procs += [start_worker(url) for _ in range(2)]
        time.sleep(random.uniform(0, 0.05))
        assert victim.poll() is None  # it works until no job is left, so it is still at it
        victim.send_signal(signal.SIGKILL)

        outputs = [p.communicate(timeout=180) for p in procs]
        elapsed = time.monotonic() - t0
        assert procs[0].returncode == -signal.SIGKILL, outputs[0]
        assert procs[1].returncode == -signal.SIGKILL, outputs[1]
        for p, (_, err) in zip(procs[2:], outputs[2:], strict=True):
            assert p.returncode == 0, err

        stats = check_fleet_outcome(rt, side, job_ids)
        # the dead workers' jobs were really taken over, and the step worker 0 left in flight
        # (it had acted) was found by reconcile instead of being executed again
        assert stats["reclaimed"] >= 1
        assert stats["caught_up"] >= 1
        print(f"{n_jobs} jobs × 3 steps, 4 workers (2 killed): {elapsed:.1f}s, {stats}")


@pytest.mark.soak
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_chaos_soak(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> None:
    """A random worker of four is SIGKILLed and replaced 12 times, every 0.2–1 s (SQLite:
    0.05–0.4 s), while they run 1,000 jobs (PostgreSQL: 4,000, so that the work outlasts the
    kills). On SQLite the workers are four processes on one file: a kill may land inside a
    write transaction or a checkpoint, which the next opener recovers from the WAL."""
    if backend == "sqlite":  # a step takes well under a millisecond there: kill more often
        url, pause, n_jobs = f"sqlite:///{tmp_path / 'chaos.db'}", (0.05, 0.4), 1000
    else:
        url = with_schema(PG_URL, request.getfixturevalue("pg_schema"))
        pause, n_jobs = (0.2, 1.0), 4000
    side = tmp_path / "side.jsonl"
    rng = random.Random(os.getpid())
    with Runtime(url, tools=REGISTRY) as rt:
        job_ids = submit_jobs(rt, side, n_jobs)
        procs = [start_worker(url) for _ in range(4)]
        dead: list[subprocess.Popen[str]] = []
        kills = 0
        while kills < 12:
            time.sleep(rng.uniform(*pause))
            alive = [p for p in procs if p.poll() is None]
            if not alive:
                break
            victim = rng.choice(alive)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            procs.remove(victim)
            dead.append(victim)
            kills += 1
            procs.append(start_worker(url))
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err
        for p in dead:
            p.communicate()
        stats = check_fleet_outcome(rt, side, job_ids)
        print(f"soak: {n_jobs} jobs, {kills} kills: {stats}")
        assert kills == 12 and stats["reclaimed"] >= 1  # the kills did land on running jobs


def test_a_worker_running_several_jobs_at_once_is_killed(store_url: str, tmp_path: Path) -> None:
    """``--concurrency 4``: the worker dies (SIGKILL, at a crash point right after its 30th tool
    call acted) while its claim loops hold up to four jobs, one with a step in flight; another
    worker reclaims every one once its lease expires and finds the step that acted by reconcile.

    The worker kills itself rather than being killed from outside: from outside, on a fast
    machine it could finish every job before the signal lands, and nothing would be reclaimed."""
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_ids = submit_jobs(rt, side, 120)
        args = ("--until-done", "--lease", LEASE, "--deadline", "300", "--concurrency", "4")
        victim = spawn_driver(store_url, *args, crash="tool.after_execute:30")
        _, err = victim.communicate(timeout=120)
        assert victim.returncode == -signal.SIGKILL, err
        held = rt.store.list_jobs(JobFilter(status=["running"], limit=10))
        # it died holding several jobs (its four loops are nearly always inside one)
        assert len(held) >= 2, held
        assert {str(j.lease_owner).rsplit(":", 2)[1] for j in held} == {str(victim.pid)}, held
        survivor = spawn_driver(store_url, *args)
        _, err = survivor.communicate(timeout=180)
        assert survivor.returncode == 0, err
        # every job it held was taken over and completed, every step acted once; the steps it
        # left in flight (they had acted) were found by reconcile instead of run again
        stats = check_fleet_outcome(rt, side, job_ids)
        assert stats["caught_up"] >= 1, stats
