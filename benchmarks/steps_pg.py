"""bench_steps on PostgreSQL: affidavit against DBOS Transact on the same server, whole process.

The shape users with several hosts run: ``JOBS`` jobs of ``STEPS`` trivial chained tool steps.

* affidavit: the jobs are submitted (not timed), then one ``affidavit worker --until-idle
  --concurrency 4`` process runs them all; timed from spawn to exit (import, connect, claim,
  run, complete, seal).
* DBOS Transact: one Python process (``DBOS`` with a PostgreSQL system database on the same
  server, in its own database) starts the same number of workflows of ``STEPS`` trivial
  ``@DBOS.step()`` calls from 4 threads; timed from spawn to exit (import, launch, run).
* Floor: the protocol's own statements replayed as plain SQL from 4 connections (threads), per
  step T1 (ledger insert + two event rows, a synced commit) and T2 (ledger update + three event
  rows, a commit not waited for), each one message of statements and one round trip, as the
  store sends them (values bound on the client, the events one multi-row insert), no hashing, no
  runtime around them: what any implementation of this protocol pays on this server.
* Latency: per-step p50 of the affidavit worker (its step timestamps from the log) next to the
  floor's per-step p50: what affidavit adds to a step on PostgreSQL.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql

from affidavit import Runtime, Tool, ToolRegistry
from benchmarks._report import median, pg_conninfo, pg_fresh_database, pg_fresh_schema

CONCURRENCY = 4
GOAL_VS_DBOS_PG = 3.0  # tool steps/s ≥ 3 × DBOS on the same PostgreSQL server, whole process
CHILD_TIMEOUT_S = 900
TOOL_NAME = "bench_pg.noop"

# the submitter's copy of the tool (not registered process-wide: each repetition reuses it)
_NOOP = Tool(TOOL_NAME, lambda ctx, i, prev=None: i, "tool")

TOOLS_MODULE = f'''\
"""The benchmark's one tool, for `affidavit worker --tools`."""
import affidavit


@affidavit.tool("{TOOL_NAME}")
def noop(ctx, i, prev=None):
    return i
'''

DBOS_PG_CHILD = '''\
"""N DBOS workflows of S chained trivial steps from 4 threads, PostgreSQL system database."""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

t0 = time.perf_counter()
from dbos import DBOS, SetWorkflowID

url, jobs, steps, prefix, threads = (
    sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
)
DBOS(config={"name": "bench-steps-pg", "system_database_url": url, "log_level": "WARNING"})


@DBOS.step()
def noop(i, prev):
    return i


@DBOS.workflow()
def chain(n):
    prev = None
    for i in range(n):
        prev = noop(i, prev)
    return prev


DBOS.launch()
t_launch = time.perf_counter()


def one(k):
    with SetWorkflowID(f"{prefix}-{k}"):
        return chain(steps)


with ThreadPoolExecutor(threads) as pool:
    results = list(pool.map(one, range(jobs)))
t_run = time.perf_counter()
DBOS.destroy()
print(json.dumps({"ok": all(r == steps - 1 for r in results), "launch_s": t_launch - t0,
                  "run_s": t_run - t_launch}))
'''


@dataclass(slots=True)
class PgComparison:
    """Repetitions of the PostgreSQL comparison (steps/s, whole process)."""

    jobs: int
    steps: int
    affidavit: list[float] = field(default_factory=list)
    dbos: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    step_p50_ms: list[float] = field(default_factory=list)  # affidavit, per tool step
    floor_p50_ms: list[float] = field(default_factory=list)
    dbos_error: str | None = None

    @property
    def ratio(self) -> float | None:
        if not self.affidavit or not self.dbos:
            return None
        return median(self.affidavit) / median(self.dbos)


def _chain_plan(steps: int) -> dict[str, object]:
    nodes: list[dict[str, object]] = [
        {"id": "s0", "type": "tool", "tool": TOOL_NAME, "args": {"i": 0}}
    ]
    nodes += [
        {
            "id": f"s{k}",
            "type": "tool",
            "tool": TOOL_NAME,
            "args": {"i": k, "prev": f"${{s{k - 1}}}"},
            "depends_on": [f"s{k - 1}"],
        }
        for k in range(1, steps)
    ]
    return {"name": "bench-steps-pg", "nodes": nodes}


def _affidavit_cli() -> str:
    return str(Path(sys.executable).with_name("affidavit"))


def run_affidavit(
    url: str,
    jobs: int,
    steps: int,
    tmp: Path,
    *,
    processes: int = 1,
    concurrency: int = CONCURRENCY,
) -> tuple[float, float]:
    """steps/s of one ``affidavit worker --until-idle --concurrency 4`` process (or of
    ``--processes N --concurrency C``), and the per-tool-step p50 in ms (from
    ``tool_invocation_started`` to ``node_finished``)."""
    tools = tmp / "bench_pg_tools.py"
    tools.write_text(TOOLS_MODULE, encoding="utf-8")
    with pg_fresh_schema(url, "bench_pg") as store_url:
        with Runtime(store_url, tools=ToolRegistry([_NOOP])) as rt:
            plan = _chain_plan(steps)
            for _ in range(jobs):
                rt.submit(plan, {})
        cmd = [
            _affidavit_cli(),
            "worker",
            "--db",
            store_url,
            "--tools",
            str(tools),
            "--until-idle",
            "--concurrency",
            str(concurrency),
            "--json",
        ] + (["--processes", str(processes)] if processes > 1 else [])
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"affidavit worker exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        _check_affidavit(store_url, jobs, steps)
        p50 = _step_p50_ms(store_url)
    return jobs * steps / elapsed, p50


def _connect(store_url: str) -> psycopg.Connection[tuple[object, ...]]:
    base, _, query = store_url.partition("?schema=")
    conn = psycopg.connect(pg_conninfo(base), autocommit=True)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(query)))
    return conn


def _check_affidavit(store_url: str, jobs: int, steps: int) -> None:
    with _connect(store_url) as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone()
        done = row[0] if row else 0
        row = conn.execute(
            "SELECT count(*) FROM tool_invocations WHERE status = 'committed'"
        ).fetchone()
        committed = row[0] if row else 0
    if done != jobs or committed != jobs * steps:
        raise RuntimeError(f"affidavit: {done}/{jobs} jobs completed, {committed} steps committed")


def _step_p50_ms(store_url: str) -> float:
    """Median time from a tool step's T1 (``tool_invocation_started.at``) to its T2
    (``node_finished.at``), over every step of the run."""
    with _connect(store_url) as conn:
        rows = conn.execute(
            "SELECT type, convert_from(payload, 'UTF8')::jsonb->>'at',"
            " convert_from(payload, 'UTF8')::jsonb->>'node_id', job_id"
            " FROM events WHERE type IN ('tool_invocation_started', 'node_finished')"
        ).fetchall()
    started: dict[tuple[str, str], datetime] = {}
    spans: list[float] = []
    for kind, at, node, job in rows:
        ts = datetime.fromisoformat(str(at))
        key = (str(job), str(node))
        if kind == "tool_invocation_started":
            started[key] = ts
        elif key in started:
            spans.append((ts - started.pop(key)).total_seconds() * 1000)
    return statistics.median(spans) if spans else float("nan")


def run_dbos(url: str, jobs: int, steps: int, tmp: Path) -> float:
    """steps/s of one DBOS process running ``jobs`` workflows from 4 threads (spawn to exit)."""
    script = tmp / "child_dbos_pg.py"
    script.write_text(DBOS_PG_CHILD, encoding="utf-8")
    with pg_fresh_database(url, "bench_dbos") as db_url:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(script), db_url, str(jobs), str(steps), "wf", str(CONCURRENCY)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"DBOS child exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if not report["ok"]:
        raise RuntimeError("DBOS: a workflow returned a wrong result")
    return jobs * steps / elapsed


FLOOR_DDL = textwrap.dedent(
    """\
    CREATE TABLE ledger (job text, key int, status text, result bytea,
                         PRIMARY KEY (job, key));
    CREATE TABLE log (job text, version int, payload bytea, chain bytea,
                      PRIMARY KEY (job, version));
    """
)


def _floor_jobs(store_url: str, jobs: range, steps: int, spans: list[float]) -> None:
    payload = b"x" * 256
    chain = b"h" * 32
    with _connect(store_url) as conn:
        cursor = psycopg.ClientCursor(conn)
        ledger_insert = "INSERT INTO ledger VALUES (%s, %s, 'started', NULL)"
        ledger_update = (
            "UPDATE ledger SET status = 'committed', result = %s WHERE job = %s AND key = %s"
        )

        def events(job: str, first: int, n: int) -> str:
            rows = (
                cursor.mogrify("(%s, %s, %s, %s)", (job, v, payload, chain))
                for v in range(first, first + n)
            )
            return "INSERT INTO log VALUES " + ", ".join(rows)

        for j in jobs:
            job = f"job{j}"
            version = 0
            for s in range(steps):
                t0 = time.perf_counter()
                # T1: synced commit; one message
                t1 = [
                    "BEGIN",
                    cursor.mogrify(ledger_insert, (job, s)),
                    events(job, version + 1, 2),
                    "COMMIT",
                ]
                cursor.execute(";\n".join(t1))
                version += 2
                # T2: written, not waited for; one message
                t2 = [
                    "BEGIN",
                    "SET LOCAL synchronous_commit = off",
                    cursor.mogrify(ledger_update, (payload, job, s)),
                    events(job, version + 1, 3),
                    "COMMIT",
                ]
                cursor.execute(";\n".join(t2))
                version += 3
                spans.append((time.perf_counter() - t0) * 1000)


def run_floor(url: str, jobs: int, steps: int) -> tuple[float, float]:
    """The protocol's writes as plain SQL from ``CONCURRENCY`` connections (threads), as many
    jobs each: per step T1 (ledger insert + 2 events, synced) and T2 (ledger update + 3 events,
    written), each one message of statements (one round trip) as the store sends them;
    steps/s and the per-step p50 in ms."""
    with pg_fresh_schema(url, "bench_pg") as store_url:
        with _connect(store_url) as conn:
            schema = store_url.partition("?schema=")[2]
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute(FLOOR_DDL)
            conn.commit()
        spans: list[float] = []
        threads = [
            threading.Thread(
                target=_floor_jobs,
                args=(store_url, range(k, jobs, CONCURRENCY), steps, spans),
            )
            for k in range(CONCURRENCY)
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    return jobs * steps / elapsed, statistics.median(spans)


def reachable(url: str, say: Callable[[str], object]) -> str | None:
    """The server's version, or ``None`` (said, and the PostgreSQL cases skipped)."""
    try:
        with psycopg.connect(pg_conninfo(url), connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error as exc:
        say(f"PostgreSQL unreachable: {str(exc).strip()}; skipping the PostgreSQL cases")
        return None
    return str(row[0]) if row else "unknown"


def measure_pg(
    url: str, jobs: int, steps: int, reps: int, tmp: Path, say: Callable[[str], object]
) -> PgComparison:
    """Alternate affidavit, DBOS and the floor ``reps`` times, saying each result."""
    result = PgComparison(jobs, steps)
    for rep in range(reps):
        cases = ["affidavit", "dbos", "floor"]
        shift = rep % len(cases)
        for case in cases[shift:] + cases[:shift]:
            if case == "affidavit":
                rate, p50 = run_affidavit(url, jobs, steps, tmp)
                result.affidavit.append(rate)
                result.step_p50_ms.append(p50)
                say(f"    PostgreSQL, affidavit worker: {rate:,.0f} steps/s, p50 {p50:.2f} ms/step")
            elif case == "dbos":
                if result.dbos_error is not None:
                    continue
                try:
                    rate = run_dbos(url, jobs, steps, tmp)
                except (ImportError, RuntimeError, OSError) as exc:
                    result.dbos_error = str(exc).strip().splitlines()[-1]
                    say(f"    PostgreSQL, DBOS not measured: {result.dbos_error}")
                    continue
                result.dbos.append(rate)
                say(f"    PostgreSQL, DBOS: {rate:,.0f} steps/s")
            else:
                rate, p50 = run_floor(url, jobs, steps)
                result.floor.append(rate)
                result.floor_p50_ms.append(p50)
                say(f"    PostgreSQL, plain-SQL floor: {rate:,.0f} steps/s, p50 {p50:.2f} ms/step")
    return result
