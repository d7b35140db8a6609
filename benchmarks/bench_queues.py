"""Benchmark queues with limits against DBOS Transact's queues, on PostgreSQL, in one run.

* Dispatch: ``JOBS`` jobs of one trivial tool step in a queue of concurrency 4. affidavit: the
  jobs are submitted (not timed), then one ``affidavit worker --until-idle --concurrency 4
  --queue bench`` process runs them, timed from spawn to exit. DBOS: one process declares a
  ``Queue("bench", concurrency=4)``, enqueues as many workflows of one ``@DBOS.step()`` and
  waits for them, timed from spawn to exit — with DBOS's default polling interval (1 s) and
  with 0.05 s. Jobs per second.
* Rate: ``RATE_JOBS`` jobs through a queue with rate ``RATE`` (and the same limiter on DBOS);
  achieved rate = (starts − N) / (last start − first start) over the recorded start times
  (affidavit: the claims' grants; DBOS: each workflow notes when it began), ÷ the allowed rate.
* Limit check: per claim, a claim from a limited queue (lock, counts, grant) minus a claim of
  the default queue, in µs, in this process (PostgreSQL and SQLite).
* Default queue: bench_steps's PostgreSQL case (200 jobs × 5 tool steps, one worker process
  of concurrency 4) with this checkout and with ``--before`` (another checkout and its
  interpreter: the code before queues), alternated, steps/s.

Usage (from the repository root)::

    python -m benchmarks.bench_queues [--pg-url URL] [--before /path/to/checkout] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit import Runtime, Tool, ToolRegistry
from affidavit.core.rates import parse_rate
from affidavit.store import open_store
from affidavit.store.queues import (
    Placement,
    claim_from_queue,
    queue_config,
    recorded_grants,
    set_queue,
)
from benchmarks._report import median, pg_fresh_database, pg_fresh_schema
from benchmarks.steps_pg import TOOL_NAME, TOOLS_MODULE, _affidavit_cli, _chain_plan
from benchmarks.steps_sqlite import DEFAULT_PG_URL

CONCURRENCY = 4
RATE = "20/1s"
TIMEOUT_S = 900

DBOS_CHILD = textwrap.dedent(
    '''\
    """N DBOS workflows of one step through a queue; prints the workflows' start times."""
    import json
    import sys
    import time

    from dbos import DBOS

    url, jobs, concurrency, limit, period, polling = sys.argv[1:7]
    DBOS(config={"name": "bench-queues", "system_database_url": url, "log_level": "WARNING"})
    limiter = {"limit": int(limit), "period": float(period)} if int(limit) else None


    @DBOS.step()
    def noop(i):
        return i


    @DBOS.workflow()
    def one(i):
        began = time.time()
        noop(i)
        return began


    DBOS.launch()
    queue = DBOS.register_queue("bench", global_concurrency=int(concurrency) or None,
                                limiter=limiter, polling_interval_sec=float(polling))
    handles = [queue.enqueue(one, i) for i in range(int(jobs))]
    starts = [h.get_result() for h in handles]
    DBOS.destroy()
    print(json.dumps({"starts": starts}))
    '''
)


def achieved_ratio(starts: list[float], rate: str) -> float:
    """(starts − N) / (last − first) ÷ N/PERIOD: 1.0 when every window was used in full."""
    parsed = parse_rate(rate)
    ordered = sorted(starts)
    span = ordered[-1] - ordered[0]
    return (len(ordered) - parsed.count) / span / parsed.per_second()


def run_affidavit(url: str, jobs: int, tmp: Path, rate: str | None) -> tuple[float, list[float]]:
    """Jobs/s of one worker process through queue ``bench``, and the recorded start times."""
    tools = tmp / "bench_queue_tools.py"
    tools.write_text(TOOLS_MODULE, encoding="utf-8")
    with pg_fresh_schema(url, "bench_q") as store_url:
        noop = Tool(TOOL_NAME, lambda ctx, i, prev=None: i, "tool")
        with Runtime(store_url, tools=ToolRegistry([noop])) as rt:
            config = (
                queue_config("bench", rate=rate)
                if rate
                else queue_config("bench", concurrency=CONCURRENCY)
            )
            set_queue(rt.store, config)
            plan = _chain_plan(1)
            for _ in range(jobs):
                rt.submit(plan, {}, queue="bench")
        cmd = [_affidavit_cli(), "worker", "--db", store_url, "--tools", str(tools),
               "--until-idle", "--concurrency", str(CONCURRENCY), "--queue", "bench",
               "--json"]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0 or json.loads(proc.stdout)["jobs_run"] != jobs:
            raise RuntimeError(f"affidavit worker: {proc.stdout} {proc.stderr[-2000:]}")
        store = open_store(store_url)
        try:
            starts = [g["claimed_at"] for g in recorded_grants(store, "bench", 0.0)]
        finally:
            store.close()
    return jobs / elapsed, starts


def run_dbos(
    url: str, jobs: int, tmp: Path, rate: str | None, polling: float
) -> tuple[float, list[float]]:
    script = tmp / "child_dbos_queue.py"
    script.write_text(DBOS_CHILD, encoding="utf-8")
    parsed = parse_rate(rate) if rate else None
    args = [str(jobs), "0" if rate else str(CONCURRENCY),
            str(parsed.count if parsed else 0), str(parsed.period_seconds if parsed else 0),
            str(polling)]  # fmt: skip
    with pg_fresh_database(url, "bench_dbos_q") as db_url:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(script), db_url, *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"DBOS child exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    starts = json.loads(proc.stdout.strip().splitlines()[-1])["starts"]
    return jobs / elapsed, starts


def limit_check_us(url: str, claims: int) -> float:
    """µs a claim from a limited queue costs beyond a claim of the default queue."""
    store = open_store(url)
    try:
        set_queue(store, queue_config("cost", concurrency=claims + 10, rate=f"{claims + 10}/1h"))
        for _ in range(claims):
            store.create_job(plan_name="p")
            store.create_job(plan_name="p", placement=Placement("cost"))
        now = time.time()
        t0 = time.perf_counter()
        for i in range(claims):
            store.claim(owner="w", attempt_id=f"d{i}", now=now, lease_seconds=600)
        t1 = time.perf_counter()
        for i in range(claims):
            claim_from_queue(
                store, "cost", owner="w", attempt_id=f"q{i}", now=now, lease_seconds=600
            )
        t2 = time.perf_counter()
    finally:
        store.close()
    return ((t2 - t1) - (t1 - t0)) / claims * 1e6


def steps_default(checkout: Path, python: str, url: str, tmp: Path) -> float:
    """bench_steps's PostgreSQL case (200 × 5) run by ``checkout``'s code: steps/s."""
    code = (
        "import sys, json; from pathlib import Path; "
        f"sys.path.insert(0, {str(checkout)!r}); "
        "from benchmarks.steps_pg import run_affidavit; "
        f"print(json.dumps(run_affidavit({url!r}, 200, 5, Path({str(tmp)!r}))))"
    )
    proc = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=checkout
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return float(json.loads(proc.stdout.strip().splitlines()[-1])[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of the code before queues")
    parser.add_argument("--quick", action="store_true")
    ns = parser.parse_args()
    jobs, reps = (60, 1) if ns.quick else (ns.jobs, ns.reps)
    here = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ours, dbos_default, dbos_fast = [], [], []
        for _ in range(reps):
            ours.append(run_affidavit(ns.pg_url, jobs, tmp, None)[0])
            dbos_default.append(run_dbos(ns.pg_url, jobs, tmp, None, 1.0)[0])
            dbos_fast.append(run_dbos(ns.pg_url, jobs, tmp, None, 0.05)[0])
            print(f"dispatch: affidavit {ours[-1]:.0f}/s, DBOS {dbos_default[-1]:.0f}/s "
                  f"(polling 1 s), {dbos_fast[-1]:.0f}/s (0.05 s)", flush=True)  # fmt: skip
        rate_jobs = 60 if ns.quick else 100
        ours_rate = achieved_ratio(run_affidavit(ns.pg_url, rate_jobs, tmp, RATE)[1], RATE)
        dbos_rate = achieved_ratio(run_dbos(ns.pg_url, rate_jobs, tmp, RATE, 0.05)[1], RATE)
        print(f"rate {RATE}: affidavit achieves {ours_rate:.1%} of it, DBOS {dbos_rate:.1%}")
        with pg_fresh_schema(ns.pg_url, "bench_qc") as url:
            pg_cost = limit_check_us(url, 300 if not ns.quick else 50)
        sqlite_cost = limit_check_us(f"sqlite:///{tmp / 'cost.db'}", 300 if not ns.quick else 50)
        print(f"limit check per claim: PostgreSQL {pg_cost:.0f} µs, SQLite {sqlite_cost:.0f} µs")
        print(
            f"dispatch (median of {reps}): affidavit {median(ours):.0f} jobs/s, DBOS "
            f"{median(dbos_default):.0f} (default polling) / {median(dbos_fast):.0f} (0.05 s): "
            f"{median(ours) / median(dbos_default):.1f}× / {median(ours) / median(dbos_fast):.1f}×"
        )
        if ns.before is not None:
            before_python = str(ns.before / ".venv" / "bin" / "python")
            after, before = [], []
            for _ in range(reps):
                before.append(steps_default(ns.before, before_python, ns.pg_url, tmp))
                after.append(steps_default(here, sys.executable, ns.pg_url, tmp))
                print(f"default queue steps/s: before {before[-1]:.0f}, after {after[-1]:.0f}")
            print(f"default queue (median of {reps}): before {median(before):.0f} steps/s, "
                  f"after {median(after):.0f} steps/s")  # fmt: skip


if __name__ == "__main__":
    main()
