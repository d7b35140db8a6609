"""The worst day on PostgreSQL: several real ``affidavit worker`` processes run jobs while a
driver SIGKILLs workers every few seconds (starting a new one each time, perhaps while the
server is down), restarts the PostgreSQL server (fast shutdown, and immediate: as a crash) and
freezes a worker (SIGSTOP) past its lease before letting it go on.

Each job is five steps, two of them effectful (``tests/chaos/tools.py``): every effect is a row
keyed by the call's external key in a world database the driver never restarts. Passing means:
every job ended (completed, or parked with a stated reason — none pending, running or lost),
no step's effect happened twice (one row per effectful step of a completed job, and that row's
key is the one the job's ledger recorded), and ``affidavit verify --all`` finds nothing wrong.
The counts are printed.

The bounded run (the default suite) is 60 jobs with about two restarts, a freeze and a kill
every 2–4 s; ``--chaos-long`` runs 240 jobs with four restarts, three freezes and a kill
every 2–6 s.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from affidavit import Runtime
from affidavit.store import JobFilter
from tests.chaos import tools as chaos_tools
from tests.conftest import PG_URL, REQUIRE_PG, drop_schema, pg_available, with_schema
from tests.pg_cluster import PrivateCluster, private_cluster_or_skip

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]
LEASE = 5.0


@dataclass(frozen=True)
class Shape:
    jobs: int
    workers: int
    chaos_seconds: float  # how long the driver keeps making trouble
    kill_every: tuple[float, float]
    restarts: int
    freezes: int
    delay: float  # seconds each effectful call takes after its effect


BOUNDED = Shape(
    jobs=60, workers=3, chaos_seconds=30, kill_every=(2, 4), restarts=2, freezes=1, delay=0.35
)
LONG = Shape(
    jobs=240, workers=3, chaos_seconds=150, kill_every=(2, 6), restarts=4, freezes=3, delay=0.4
)


@dataclass
class Counts:
    kills: int = 0
    restarts: int = 0
    freezes: int = 0
    started: int = 0
    events: list[str] = field(default_factory=list)


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    yield from private_cluster_or_skip()


@pytest.fixture
def world() -> Iterator[str]:
    """A schema of the test's own on the shared server (never restarted) holding the effects."""
    if not pg_available():
        if REQUIRE_PG:  # CI: PostgreSQL is required, never skipped
            pytest.fail(f"the world database (PostgreSQL at {PG_URL}) is unreachable")
        pytest.skip(f"the world database (PostgreSQL at {PG_URL}) is unreachable")
    schema = f"chaos_{uuid.uuid4().hex[:12]}"
    url = with_schema(PG_URL, schema)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(chaos_tools.SCHEMA)
    yield url
    drop_schema(schema)


class Fleet:
    """The worker processes, each logging to a file of its own."""

    def __init__(self, url: str, world: str, logs: Path) -> None:
        self.url = url
        self.env = {**os.environ, "CHAOS_WORLD_URL": world, "PYTHONPATH": str(ROOT)}
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.gone: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"worker-{len(self.procs) + len(self.gone)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "affidavit",
                "worker",
                "--db",
                self.url,
                "--tools",
                "tests.chaos.tools",
                "--concurrency",
                "2",
                "--lease-seconds",
                str(LEASE),
                "--max-outage-seconds",
                "300",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGCONT)  # (a frozen one dies too)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.procs.remove(proc)
        self.gone.append(proc)

    def stop_all(self) -> list[int]:
        for p in self.alive():
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=120))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        return codes


def _status_counts(url: str) -> Counter[str] | None:
    """The jobs by status, or ``None`` while the server is away."""
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            rows = conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
    except psycopg.OperationalError:
        return None
    return Counter({status: int(n) for status, n in rows})


def _run_chaos(cluster: PrivateCluster, world: str, tmp_path: Path, shape: Shape) -> None:
    url = cluster.create_database("chaos")
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    with Runtime(url) as rt:
        plan = chaos_tools.order_plan(delay=shape.delay)
        job_ids = [rt.submit(plan, {"n": i}).job_id for i in range(shape.jobs)]
    fleet = Fleet(url, world, tmp_path)
    for _ in range(shape.workers):
        fleet.start()
    counts = Counts(started=shape.workers)
    began = time.monotonic()

    def done() -> str:
        by_status = _status_counts(url)
        if by_status is None:
            return "server away"
        return f"{by_status['completed'] + by_status['parked']}/{shape.jobs} done"

    # the restarts and freezes at spread, random moments of the chaos phase
    span = shape.chaos_seconds
    restart_at = sorted(rng.uniform(0.15 * span, 0.55 * span) for _ in range(shape.restarts))
    freeze_at = sorted(rng.uniform(0.1 * span, 0.45 * span) for _ in range(shape.freezes))
    next_kill = rng.uniform(*shape.kill_every)
    thawing: list[threading.Timer] = []
    try:
        while (elapsed := time.monotonic() - began) < span:
            if not restart_at and not freeze_at and int(elapsed * 10) % 20 == 0:
                by_status = _status_counts(url)  # (every 2 s once the scheduled trouble is over)
                if by_status is not None and not (by_status["pending"] or by_status["running"]):
                    break
            if restart_at and elapsed >= restart_at[0]:
                restart_at.pop(0)
                mode = "immediate" if counts.restarts % 2 else "fast"
                cluster.stop(mode)
                time.sleep(rng.uniform(0.5, 3.0))  # down for a moment: workers may start now
                if rng.random() < 0.5 and fleet.alive():
                    fleet.kill(rng.choice(fleet.alive()))
                    counts.kills += 1
                    fleet.start()
                    counts.started += 1
                cluster.start()
                counts.restarts += 1
                counts.events.append(f"{elapsed:5.1f}s restart ({mode}), {done()}")
            if freeze_at and elapsed >= freeze_at[0] and fleet.alive():
                freeze_at.pop(0)
                frozen = rng.choice(fleet.alive())
                frozen.send_signal(signal.SIGSTOP)
                timer = threading.Timer(LEASE * 2.5, frozen.send_signal, (signal.SIGCONT,))
                timer.start()
                thawing.append(timer)
                counts.freezes += 1
                counts.events.append(f"{elapsed:5.1f}s SIGSTOP pid {frozen.pid}, {done()}")
            if elapsed >= next_kill:
                alive = fleet.alive()
                if alive:
                    fleet.kill(rng.choice(alive))
                    counts.kills += 1
                    fleet.start()
                    counts.started += 1
                    counts.events.append(f"{elapsed:5.1f}s SIGKILL, {done()}")
                next_kill = elapsed + rng.uniform(*shape.kill_every)
            time.sleep(0.1)
        # calm: no more trouble; wait until no job is pending or running
        deadline = time.monotonic() + 300
        while True:
            by_status = _status_counts(url)
            if by_status is not None and not (by_status["pending"] or by_status["running"]):
                break
            assert time.monotonic() < deadline, f"jobs left unfinished: {by_status}"
            time.sleep(0.5)
    finally:
        for timer in thawing:
            timer.cancel()
        codes = fleet.stop_all()
    elapsed = time.monotonic() - began
    # (a worker stopped while it was still starting — importing, before its handler for
    # SIGTERM is installed — ends by the signal, having claimed nothing)
    failed = [(p.args, c) for p, c in zip(fleet.procs, codes, strict=True) if c not in (0, -15)]
    assert not failed, (codes, _tail_logs(tmp_path))

    # (1) every job ended: completed, or parked with a reason
    with Runtime(url) as rt:
        jobs = rt.store.list_jobs(JobFilter(limit=shape.jobs + 10))
        assert sorted(j.job_id for j in jobs) == sorted(job_ids)
        statuses = Counter(j.status for j in jobs)
        assert set(statuses) <= {"completed", "parked"}, statuses
        parked_reasons: Counter[str] = Counter()
        recorded: dict[tuple[str, str], str] = {}
        for job in jobs:
            if job.status == "parked":
                events = rt.store.list_events(job.job_id)
                parks = [e.payload for e in events if e.type == "job_parked"]
                assert parks, f"job {job.job_id} parked without a job_parked event"
                parked_reasons[str(parks[-1].get("reason"))] += 1
            with rt.store.transaction(durable=False) as tx:
                for row in tx.ledger_list(job.job_id):
                    if row.status == "committed":
                        recorded[(job.job_id, row.node_id)] = row.result["ref"]
    # (2) no effect twice; every recorded effect is the one that happened
    with _world(world) as conn:
        effects = conn.execute("SELECT job_id, node_id, ext_key FROM effects").fetchall()
    per_step = Counter((job_id, node_id) for job_id, node_id, _ in effects)
    twice = {step: n for step, n in per_step.items() if n > 1}
    assert not twice, f"effects executed more than once: {twice}"
    happened = {(job_id, node_id): key for job_id, node_id, key in effects}
    for (job_id, node_id), key in recorded.items():
        assert happened.get((job_id, node_id)) == key, (job_id, node_id)
    for job in jobs:
        if job.status == "completed":
            assert (job.job_id, "charge") in recorded and (job.job_id, "notify") in recorded
    # (3) verify --all finds nothing wrong
    verified = subprocess.run(
        [sys.executable, "-m", "affidavit", "verify", "--all", "--json", "--db", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(verified.stdout)
    assert verified.returncode == 0 and report["failed"] == 0, verified.stdout[-2000:]
    assert report["jobs"] == shape.jobs
    summary = {
        "jobs": shape.jobs,
        "completed": statuses["completed"],
        "parked": dict(parked_reasons),
        "kills": counts.kills,
        "restarts": counts.restarts,
        "freezes": counts.freezes,
        "workers_started": counts.started,
        "effects": len(effects),
        "duplicated_effects": 0,
        "verified": report["verified"],
        "seconds": round(elapsed, 1),
    }
    print("\nchaos (PostgreSQL): " + json.dumps(summary))
    for line in counts.events:
        print("  " + line)
    # the trouble really happened
    assert counts.restarts == shape.restarts and counts.freezes == shape.freezes
    assert counts.kills >= 3


def _world(world: str) -> psycopg.Connection[Any]:
    base, _, schema = world.partition("?schema=")
    conn = psycopg.connect(base, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    return conn


def _tail_logs(logs: Path) -> str:
    parts = []
    for path in sorted(logs.glob("worker-*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "Traceback" in text or "Error" in text:
            parts.append(f"--- {path.name}\n{text[-6000:]}")
    return "\n".join(parts)


def test_workers_killed_server_restarted_worker_frozen(
    request: pytest.FixtureRequest, cluster: PrivateCluster, world: str, tmp_path: Path
) -> None:
    shape = LONG if request.config.getoption("--chaos-long") else BOUNDED
    _run_chaos(cluster, world, tmp_path, shape)
