"""Benchmark child jobs against DBOS child workflows: fan-out of N child agents and a join.

Each case in a fresh subprocess, on SQLite and PostgreSQL (a fresh schema for affidavit, a fresh
database for DBOS's system database):

- affidavit: a parent agent that starts N child agents as one batch (``ctx.start_jobs``: created
  in one transaction), each calling one trivial tool, and joins them (``ctx.join_all``); one
  process runs every job with ``Runtime.run_until_idle(concurrency=C)`` — the parent waits
  without a worker and is woken when its children end. The same with N ``ctx.start_job`` calls
  (one creation each) is measured too.
- DBOS: a ``@DBOS.workflow`` that starts N child workflows (``DBOS.start_workflow``), each
  calling one trivial ``@DBOS.step``, and waits for their results.

The time is from the parent's submission (the workflow call for DBOS) to its result, reported
by the child process. Prints a table and writes it as this benchmark's section of
``docs/PERFORMANCE.md`` (``benchmarks/results/bench_children.md``).

Usage (from the repository root)::

    python -m benchmarks.bench_children                    # default sizes; writes the report
    python -m benchmarks.bench_children --quick --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import (
    describe_machine,
    markdown_table,
    median,
    pg_server_version,
    write_section,
)
from benchmarks.bench_agents import PG_URL, child, databases

GOALS = {"sqlite": 3.0, "postgresql": 3.0}  # DBOS time ÷ affidavit time

OURS = '''\
"""affidavit: a parent agent fanning out to N child agents and joining them."""
import json
import sys
import time

from affidavit import AgentContext, Runtime, ToolContext, ToolRegistry, agent, tool

url, n, concurrency, form = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


@tool("bench_noop")
def noop(ctx: ToolContext, i: int) -> int:
    return i


@agent("bench_child", version="1")
def bench_child(ctx: AgentContext, i: int) -> int:
    return ctx.call(noop, i=i)


@agent("bench_parent", version="1")
def bench_parent(ctx: AgentContext, n: int) -> int:
    if form == "batch":
        started = ctx.start_jobs(bench_child, [{"i": i} for i in range(n)])
    else:
        started = [ctx.start_job(bench_child, {"i": i}) for i in range(n)]
    return sum(r.output for r in ctx.join_all(started))


with Runtime(url, tools=ToolRegistry([noop, bench_child, bench_parent])) as rt:
    t_start = time.perf_counter()
    job_id = rt.submit(bench_parent, {"n": n}).job_id
    runs = rt.run_until_idle(concurrency=concurrency)
    t_end = time.perf_counter()
    job = rt.get_job(job_id)
print(json.dumps({"status": job.status, "output": job.output, "run_s": t_end - t_start,
                  "runs": runs}))
'''

DBOS = '''\
"""DBOS: a workflow starting N child workflows and waiting for them."""
import json
import sys
import time

from dbos import DBOS

url, n = sys.argv[1], int(sys.argv[2])
DBOS(config={"name": "bench-children", "system_database_url": url, "log_level": "WARNING"})


@DBOS.step()
def noop(i):
    return i


@DBOS.workflow()
def child_wf(i):
    return noop(i)


@DBOS.workflow()
def parent_wf(n):
    handles = [DBOS.start_workflow(child_wf, i) for i in range(n)]
    return sum(h.get_result() for h in handles)


DBOS.launch()
t_start = time.perf_counter()
result = parent_wf(n)
t_end = time.perf_counter()
DBOS.destroy()
print(json.dumps({"result": result, "run_s": t_end - t_start}))
'''


@dataclass(frozen=True)
class Sizes:
    children: int
    concurrency: int
    reps: int


FULL = Sizes(children=100, concurrency=4, reps=3)
QUICK = Sizes(children=20, concurrency=4, reps=1)


def fan_out(backend: str, sizes: Sizes, tmp: Path, scripts: dict[str, Path]) -> dict[str, Any]:
    ours: list[float] = []
    loop: list[float] = []
    theirs: list[float] = []
    expected = sum(range(sizes.children))
    for _ in range(sizes.reps):
        for form, times in (("batch", ours), ("loop", loop)):
            with databases(backend, tmp) as (url, _):
                r = child(scripts["ours"], url, sizes.children, sizes.concurrency, form)
                assert r["status"] == "completed" and r["output"] == expected, r
                times.append(r["run_s"])
        with databases(backend, tmp) as (_, dbos_url):
            d = child(scripts["dbos"], dbos_url, sizes.children)
            assert d["result"] == expected, d
            theirs.append(d["run_s"])
        print(
            f"  {backend}: affidavit {ours[-1]:.2f} s (start_job ×N: {loop[-1]:.2f} s), "
            f"DBOS {theirs[-1]:.2f} s"
        )
    ratios = [b / a for a, b in zip(ours, theirs, strict=True)]
    loop_ratios = [b / a for a, b in zip(loop, theirs, strict=True)]
    return {
        "ours": median(ours),
        "loop": median(loop),
        "dbos": median(theirs),
        "ratio": median(ratios),
        "all": ratios,
        "loop_ratio": median(loop_ratios),
    }


def report(results: dict[str, dict[str, Any]], sizes: Sizes, pg_version: str | None) -> str:
    machine = describe_machine(pg_version)
    rows = []
    for backend, r in results.items():
        goal = GOALS[backend]
        rows.append([
            backend,
            f"{r['ours'] * 1000:,.0f}",
            f"{r['loop'] * 1000:,.0f} ({r['loop_ratio']:.1f}×)",
            f"{r['dbos'] * 1000:,.0f}",
            f"{r['ratio']:.1f}× ({', '.join(f'{x:.1f}' for x in r['all'])})",
            f"≥ {goal:.0f}×: {'met' if r['ratio'] >= goal else 'NOT met'}",
        ])  # fmt: skip
    table = markdown_table(
        [
            "backend",
            "affidavit, ms",
            "start_job ×N, ms (DBOS ÷)",
            "DBOS, ms",
            "DBOS ÷ affidavit (per rep)",
            "goal",
        ],
        rows,
        "lrrrrl",
    )
    return f"""## bench_children

{machine.markdown()}- DBOS Transact {importlib.metadata.version("dbos")}; {sizes.reps} repetition(s)
  per case, medians shown.

Fan-out and join: a parent agent starting {sizes.children} child agents as one batch
(`ctx.start_jobs`; each child one trivial tool call, each a job with its own log and seal) and
joining them, run by one process with {sizes.concurrency} concurrent runs, against a DBOS
workflow starting {sizes.children} child workflows (each one trivial step) and waiting for
them. Time from submission to the parent's result, each in a fresh process. The third column
is the same parent with {sizes.children} `ctx.start_job` calls (one creation each).

{table}
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--no-write", action="store_true", help="do not write PERFORMANCE.md")
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    results: dict[str, dict[str, Any]] = {}
    pg_version = None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        scripts = {"ours": tmp / "ours.py", "dbos": tmp / "dbos_child.py"}
        scripts["ours"].write_text(OURS)
        scripts["dbos"].write_text(DBOS)
        for backend in args.backends.split(","):
            if backend == "postgresql":
                pg_version = pg_server_version(PG_URL)
            print(f"{backend}: fan-out of {sizes.children}")
            results[backend] = fan_out(backend, sizes, tmp, scripts)
    body = report(results, sizes, pg_version)
    print(body)
    if not args.no_write:
        write_section("bench_children", body)


if __name__ == "__main__":
    main()
