"""Benchmark agent jobs against DBOS Transact: tool steps per second, and recovery.

In one run on one machine, on SQLite (fresh files) and PostgreSQL (a fresh schema, and a fresh
database for DBOS's system database), each case in a fresh subprocess:

* **throughput**: an ``@affidavit.agent`` calling one trivial ``@affidavit.tool`` N times in a
  loop (default 2,000; each call a durable tool step: ledger row, T1 synced, T2 written) against
  a ``@DBOS.workflow`` calling one trivial ``@DBOS.step`` N times. The time is the run alone
  (``Runtime.run_job``; the workflow call for DBOS), reported by the child.
* **recovery**: the same agent / workflow of 2 × K steps (default K = 1,000) is killed with
  SIGKILL right after its K-th step was recorded (affidavit: the crash point
  ``tool.after_commit:K``; DBOS: the step after the K-th kills its process before it returns);
  a new process then recovers it (affidavit: a worker run over the expired lease, which replays
  the K recorded calls; DBOS: ``DBOS.launch()``, which recovers pending workflows). Measured:
  from the start of the recovering run (after imports and opening the database) to the moment
  the first step that was not recorded executes.

Only public names of affidavit are imported. Results are printed and written to this
benchmark's section of ``docs/PERFORMANCE.md`` (``benchmarks/results/bench_agents.md``).

Usage (from the repository root)::

    python -m benchmarks.bench_agents                   # default sizes; writes the report
    python -m benchmarks.bench_agents --quick --no-write  # smoke test
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import (
    describe_machine,
    markdown_table,
    median,
    pg_server_version,
    write_section,
)

PG_URL = os.environ.get("AFFIDAVIT_BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/test")
GOALS = {"sqlite": 5.0, "postgresql": 3.0}  # agent tool steps/s ÷ DBOS steps/s

AGENT_CHILD = '''\
"""affidavit: one agent job of N tool calls (mode run), or its recovery (mode recover)."""
import json
import sys
import time

t0 = time.perf_counter()
from affidavit import AgentContext, Runtime, ToolContext, ToolRegistry, agent, tool

mode, url, n, mark = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
first_new = []


@tool("bench_noop")
def noop(ctx: ToolContext, i: int) -> int:
    if i == mark and not first_new:
        first_new.append(time.perf_counter())
    return i


@agent("bench_agent", version="1", retry={"max_attempts": 1, "backoff_seconds": 0})
def bench_agent(ctx: AgentContext, n: int) -> int:
    last = 0
    for i in range(n):
        last = ctx.call(noop, i=i)
    return last


with Runtime(url, tools=ToolRegistry([noop, bench_agent]), lease_seconds=float(sys.argv[5])) as rt:
    t_open = time.perf_counter()
    if mode == "run":
        job_id = rt.submit(bench_agent, {"n": n}).job_id
        t_start = time.perf_counter()
        job = rt.run_job(job_id)
    else:
        t_start = time.perf_counter()
        rt.run_until_idle()
        job = rt.store.list_jobs()[0]
    t_end = time.perf_counter()
    print(json.dumps({
        "status": job.status, "output": job.output, "import_open_s": t_open - t0,
        "run_s": t_end - t_start,
        "to_first_new_s": first_new[0] - t_start if first_new else None,
    }))
'''

DBOS_CHILD = '''\
"""DBOS: one workflow of N steps (mode run; killed at step `kill` when given), or recovery."""
import json
import os
import signal
import sys
import time

t0 = time.perf_counter()
from dbos import DBOS, SetWorkflowID

mode, url = sys.argv[1], sys.argv[2]
n, kill, mark = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
DBOS(config={"name": "bench-agents", "system_database_url": url, "log_level": "WARNING"})
first_new = []


@DBOS.step()
def noop(i):
    if i == kill and mode == "run":
        os.kill(os.getpid(), signal.SIGKILL)  # the K-th step was recorded, this one is not
    if i == mark and not first_new:
        first_new.append(time.perf_counter())
    return i


@DBOS.workflow()
def chain(n):
    last = 0
    for i in range(n):
        last = noop(i)
    return last


t_launch = time.perf_counter()
DBOS.launch()  # (recovers pending workflows of this executor in the background)
t_open = time.perf_counter()
if mode == "run":
    with SetWorkflowID("bench-wf"):
        result = chain(n)
    t_end = time.perf_counter()
    run_s, start = t_end - t_open, t_open
else:
    result = DBOS.retrieve_workflow("bench-wf").get_result()
    t_end = time.perf_counter()
    run_s, start = t_end - t_launch, t_launch
DBOS.destroy()
print(json.dumps({
    "result": result, "import_open_s": t_open - t0, "run_s": run_s,
    "to_first_new_s": first_new[0] - start if first_new else None,
}))
'''


@dataclass(frozen=True)
class Sizes:
    steps: int  # throughput: tool calls per agent job / steps per workflow
    recovery_half: int  # recovery: killed after this many of twice as many steps
    reps: int


FULL = Sizes(steps=2_000, recovery_half=1_000, reps=3)
QUICK = Sizes(steps=200, recovery_half=100, reps=1)


def child(script: Path, *args: object, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{script.name} {args[0]} exited {proc.returncode}: {proc.stderr[-1500:]}"
        )
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def killed(script: Path, *args: object, env: dict[str, str] | None = None) -> None:
    """Run a child that must die by SIGKILL."""
    proc = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
        check=False,
    )
    if proc.returncode != -9:
        raise RuntimeError(f"expected SIGKILL, got exit {proc.returncode}: {proc.stderr[-1500:]}")


@contextmanager
def databases(backend: str, tmp: Path) -> Iterator[tuple[str, str]]:
    """(affidavit URL, DBOS system database URL), fresh, dropped afterwards."""
    tag = uuid.uuid4().hex[:10]
    if backend == "sqlite":
        yield f"sqlite:///{tmp / f'aff_{tag}.db'}", f"sqlite:///{tmp / f'dbos_{tag}.sqlite'}"
        return
    schema, dbname = f"bench_agents_{tag}", f"bench_dbos_{tag}"
    base = PG_URL.rsplit("/", 1)[0]
    try:
        yield f"{PG_URL}?schema={schema}", f"{base}/{dbname}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )


def throughput(backend: str, sizes: Sizes, tmp: Path, scripts: dict[str, Path]) -> dict[str, Any]:
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(sizes.reps):
        with databases(backend, tmp) as (url, dbos_url):
            r = child(scripts["agent"], "run", url, sizes.steps, -1, 30)
            assert r["status"] == "completed" and r["output"] == sizes.steps - 1, r
            ours.append(sizes.steps / r["run_s"])
            d = child(scripts["dbos"], "run", dbos_url, sizes.steps, -1, -1)
            assert d["result"] == sizes.steps - 1, d
            theirs.append(sizes.steps / d["run_s"])
        print(f"  {backend}: agent {ours[-1]:,.0f} steps/s, DBOS {theirs[-1]:,.0f} steps/s")
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {"ours": median(ours), "dbos": median(theirs), "ratio": median(ratios), "all": ratios}


def recovery(backend: str, sizes: Sizes, tmp: Path, scripts: dict[str, Path]) -> dict[str, Any]:
    k = sizes.recovery_half
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(sizes.reps):
        with databases(backend, tmp) as (url, dbos_url):
            lease = 1.0
            killed(
                scripts["agent"], "run", url, 2 * k, -1, lease,
                env={"AFFIDAVIT_CRASH_AT": f"tool.after_commit:{k}"},
            )  # fmt: skip
            time.sleep(lease + 0.5)  # the dead worker's lease expires (not timed)
            r = child(scripts["agent"], "recover", url, 2 * k, k, lease)
            assert r["status"] == "completed" and r["to_first_new_s"] is not None, r
            ours.append(r["to_first_new_s"])
            killed(scripts["dbos"], "run", dbos_url, 2 * k, k, -1)
            d = child(scripts["dbos"], "recover", dbos_url, 2 * k, -1, k)
            assert d["result"] == 2 * k - 1 and d["to_first_new_s"] is not None, d
            theirs.append(d["to_first_new_s"])
        print(f"  {backend}: agent {ours[-1] * 1000:,.0f} ms, DBOS {theirs[-1] * 1000:,.0f} ms")
    return {"ours": median(ours), "dbos": median(theirs)}


def report(results: dict[str, dict[str, Any]], sizes: Sizes, pg_version: str | None) -> str:
    machine = describe_machine(pg_version)
    dbos_version = importlib.metadata.version("dbos")
    rows = []
    for backend, r in results.items():
        t, rec = r["throughput"], r["recovery"]
        goal = GOALS[backend]
        rows.append([
            backend,
            f"{t['ours']:,.0f}",
            f"{t['dbos']:,.0f}",
            f"{t['ratio']:.1f}× ({', '.join(f'{x:.1f}' for x in t['all'])})",
            f"≥ {goal:.0f}×: {'met' if t['ratio'] >= goal else 'NOT met'}",
            f"{rec['ours'] * 1000:,.0f}",
            f"{rec['dbos'] * 1000:,.0f}",
            "met" if rec["ours"] <= rec["dbos"] else "NOT met",
        ])  # fmt: skip
    table = markdown_table(
        [
            "backend",
            "agent tool steps/s",
            "DBOS steps/s",
            "ratio (per rep)",
            "goal",
            "recovery: to next new step, ms",
            "DBOS recovery, ms",
            "goal: at most DBOS's",
        ],
        rows,
        "lrrrlrrl",
    )
    return f"""## bench_agents

{machine.markdown()}- DBOS Transact {dbos_version}; {sizes.reps} repetition(s) per case, medians
  shown; the ratios compare runs seconds apart (on a shared machine, see the load average above,
  absolute numbers are noisy).

Throughput: one agent calling one trivial tool {sizes.steps:,} times (each a durable tool step)
against one `@DBOS.workflow` calling one trivial `@DBOS.step` {sizes.steps:,} times; run time
only, each in a fresh process. Recovery: killed (SIGKILL) after {sizes.recovery_half:,} of
{2 * sizes.recovery_half:,} steps; time from the start of the recovering run to the first step
that was not recorded (affidavit replays the recorded calls without executing them; DBOS's
time starts at `DBOS.launch()`, which opens its system database and starts the recovery).

{table}
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--no-write", action="store_true", help="do not write PERFORMANCE.md")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per case")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.reps is not None:
        sizes = Sizes(sizes.steps, sizes.recovery_half, max(1, args.reps))
    results: dict[str, dict[str, Any]] = {}
    pg_version = None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        scripts = {"agent": tmp / "agent_child.py", "dbos": tmp / "dbos_child.py"}
        scripts["agent"].write_text(AGENT_CHILD)
        scripts["dbos"].write_text(DBOS_CHILD)
        for backend in args.backends.split(","):
            if backend == "postgresql":
                pg_version = pg_server_version(PG_URL)
            print(f"{backend}: throughput")
            t = throughput(backend, sizes, tmp, scripts)
            print(f"{backend}: recovery")
            results[backend] = {"throughput": t, "recovery": recovery(backend, sizes, tmp, scripts)}
    body = report(results, sizes, pg_version)
    print(body)
    if not args.no_write:
        write_section("bench_agents", body)


if __name__ == "__main__":
    main()
