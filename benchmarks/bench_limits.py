"""Benchmark the cost of tool limits (``@tool(..., limit=Limit(...))``): what a grant adds to
each limited call, against the same tool unlimited, in one run on one machine.

On each backend (SQLite in a temporary directory; PostgreSQL in a fresh schema, dropped
afterwards), in-process:

* one job of N chained tool steps of an unlimited tool, then one of a tool with a limit
  (``rate`` and ``concurrency`` far above what one job reaches: it never waits), each on a
  fresh store; the difference per step is what the grant costs a call (its take before T1,
  its release inside T2);
* the take and release alone: ``limit_take`` + ``limit_release``, each its own transaction,
  per call.

Unlimited tools pay nothing (one attribute test per call): bench_steps measures them.

Usage (from the repository root)::

    python -m benchmarks.bench_limits            # prints the table
    python -m benchmarks.bench_limits --quick    # smaller sizes
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psycopg
from rich.console import Console
from rich.table import Table

from affidavit import Limit, Runtime, Tool, ToolContext, ToolRegistry, open_store

console = Console()
PG_URL = os.environ.get("AFFIDAVIT_BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/test")


def _echo(ctx: ToolContext, n: int) -> int:
    return n + 1


def _chain(steps: int, tool: str) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "s0", "type": "tool", "tool": tool, "args": {"n": 0}}]
    for i in range(1, steps):
        prev = f"s{i - 1}"
        node = {"id": f"s{i}", "type": "tool", "tool": tool, "args": {"n": "${" + prev + "}"}}
        nodes.append({**node, "depends_on": [prev]})
    return {"name": "bench", "nodes": nodes}


def _run_job(url: str, steps: int, limit: Limit | None) -> float:
    """Seconds per step of one job of ``steps`` chained calls."""
    tool = Tool("echo", _echo, "tool", limit=limit)
    with Runtime(url, tools=ToolRegistry([tool])) as rt:
        job_id = rt.submit(_chain(steps, "echo"), {}).job_id
        t0 = time.perf_counter()
        done = rt.run_job(job_id)
        took = time.perf_counter() - t0
        assert done.status == "completed", done.error
    return took / steps


def _take_release(url: str, calls: int) -> float:
    """Seconds per take + release of a grant, on a job held by a claim."""
    tool = Tool("echo", _echo, "tool")
    with Runtime(url, tools=ToolRegistry([tool])) as rt:
        job_id = rt.submit(_chain(1, "echo"), {}).job_id
    store = open_store(url)
    attempt = uuid.uuid4().hex
    assert store.claim(
        owner="bench", attempt_id=attempt, now=time.time(), lease_seconds=600, job_id=job_id
    )
    t0 = time.perf_counter()
    for _ in range(calls):
        grant = uuid.uuid4().hex
        with store.transaction(durable=False) as tx:
            taken = tx.limit_take(
                "bench",
                grant_id=grant,
                job_id=job_id,
                attempt_id=attempt,
                clock=lambda: time.time_ns() // 1000,
                rate=(10**9, 1_000_000),
                concurrency=10**6,
            )
            assert taken.granted_us is not None
        with store.transaction(durable=False) as tx:
            tx.limit_release(grant, at_us=time.time_ns() // 1000)
    took = time.perf_counter() - t0
    store.close()
    return took / calls


def _fresh(backend: str, tmp: str, n: int) -> tuple[str, Any]:
    if backend == "sqlite":
        return f"sqlite:///{tmp}/b{n}.db", None
    schema = f"bench_limits_{uuid.uuid4().hex[:10]}"
    conn = psycopg.connect(PG_URL, autocommit=True)
    conn.execute(f"CREATE SCHEMA {schema}")
    return f"{PG_URL}?schema={schema}", (conn, schema)


def _drop(handle: Any) -> None:
    if handle is not None:
        conn, schema = handle
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.close()


def measure(backend: str, steps: int, reps: int) -> dict[str, float]:
    """Median seconds per step (unlimited, limited) and per take + release."""
    unlimited, limited, grants = [], [], []
    limit = Limit(rate=f"{10**8}/1s", concurrency=10**6)
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for _ in range(reps):  # alternate, so drift hits both alike
            for sink, lim in ((unlimited, None), (limited, limit)):
                n += 1
                url, handle = _fresh(backend, tmp, n)
                try:
                    sink.append(_run_job(url, steps, lim))
                finally:
                    _drop(handle)
            n += 1
            url, handle = _fresh(backend, tmp, n)
            try:
                grants.append(_take_release(url, steps))
            finally:
                _drop(handle)

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    return {"unlimited": median(unlimited), "limited": median(limited), "grant": median(grants)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The cost of a tool limit's grant per call.")
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    args = parser.parse_args(argv)
    steps, reps = (100, 3) if args.quick else (400, 5)
    table = Table(
        "Backend",
        "Unlimited tool step",
        "Limited tool step",
        "Grant cost per call",
        "Take + release alone",
        title=f"Tool limits: {steps} chained steps, median of {reps}",
    )
    for backend in ("sqlite", *(() if args.no_pg else ("postgresql",))):
        m = measure(backend, steps, reps)
        table.add_row(
            backend,
            f"{m['unlimited'] * 1e6:,.0f} µs",
            f"{m['limited'] * 1e6:,.0f} µs",
            f"{(m['limited'] - m['unlimited']) * 1e6:+,.0f} µs",
            f"{m['grant'] * 1e6:,.0f} µs",
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
