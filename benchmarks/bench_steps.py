"""Benchmark steps per second: durable tool steps and pure steps against DBOS Transact and the
physical floor of the tool-step protocol.

On SQLite (fresh files in one temporary directory), in one run on one machine:

* affidavit: one job of 2,000 trivial chained steps (each step's args reference the previous
  step's output), once with durable ``tool`` steps (T1 synced, T2 written) and once with
  ``pure`` steps (one written transaction each);
* DBOS Transact (PyPI ``dbos``, SQLite system database, its default durability): one workflow
  of 2,000 trivial ``@DBOS.step()`` calls, each fed the previous step's result;
* the floor of our protocol: per step, one synced single-row commit (``synchronous=FULL``)
  plus one written single-row commit (``synchronous=NORMAL``) on a fresh WAL-mode file; the
  next synced commit covers the written one, exactly as T1 of the next step covers T2.

affidavit and DBOS each run in a fresh subprocess per repetition: *whole-process* is the time
from spawn to exit (import, open the database, submit, run, close), *in-process* the time of the
run alone (``Runtime.run_until_idle()``; the workflow call for DBOS), reported by the child.
The floor runs in this process (in-process only).

On PostgreSQL (a fresh schema per repetition, dropped afterwards): many small jobs (default
200 jobs × 5 chained tool steps), run by 1 worker process and by 4 worker processes.

Results are printed and written to this benchmark's section of ``docs/PERFORMANCE.md``.

Usage (from the repository root)::

    python -m benchmarks.bench_steps                  # everything; writes docs/PERFORMANCE.md
    python -m benchmarks.bench_steps --quick --no-write   # smoke test
    python -m benchmarks.bench_steps --profile        # where a tool step's time goes (no write)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.metadata
import json
import os
import pstats
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit import Runtime, ToolRegistry, pure, tool
from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.events import utc_now
from affidavit.core.ids import new_attempt_id, new_event_id, new_event_ids
from affidavit.core.plan import Plan, args_hash, idempotency_key
from affidavit.runtime.args import resolve
from affidavit.store import open_store
from affidavit.store.postgres import redact, split_url
from affidavit.store.sqlite import (  # the append statements of the store
    _GUARD,
    _JOB_NUMBER,
    _insert_rows,
)
from benchmarks._report import (
    PERFORMANCE_MD,
    Machine,
    ProfileKey,
    builtin_matcher,
    cpu_ticks,
    describe_machine,
    fmt_rate,
    function_matcher,
    markdown_table,
    median,
    pg_conninfo,
    plural,
    spread,
    steal_share,
    steal_text,
    write_section,
    yes_no,
)

SECTION = "bench_steps"
DEFAULT_PG_URL = "postgresql://root@127.0.0.1:5432/test"

GOAL_VS_DBOS = 5.0  # durable tool steps/s ≥ 5 × DBOS steps/s
GOAL_VS_FLOOR = 0.40  # durable tool steps/s ≥ 40 % of the one-sync-per-step floor

FLOOR_PAYLOAD = b"x" * 256  # a single row about the size of one of our events
CHILD_TIMEOUT_S = 600

console = Console()
if not console.is_terminal:  # piped or captured: don't wrap the tables at 80 columns
    console = Console(width=120)


# --- configuration --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each case does."""

    steps: int  # chained steps in the one SQLite job (affidavit and DBOS alike)
    reps: int  # repetitions of each affidavit case and of the floor (the median is reported)
    dbos_reps: int  # repetitions of the DBOS case (the slowest one)
    pg_jobs: int  # PostgreSQL: jobs per repetition
    pg_steps: int  # PostgreSQL: chained tool steps per job
    pg_reps: int
    pg_workers: tuple[int, ...]  # worker-process counts to compare


SIZES = Sizes(
    steps=2_000, reps=5, dbos_reps=5, pg_jobs=200, pg_steps=5, pg_reps=3, pg_workers=(1, 4)
)
QUICK_SIZES = Sizes(
    steps=200, reps=1, dbos_reps=1, pg_jobs=20, pg_steps=5, pg_reps=1, pg_workers=(1, 4)
)


# --- the work -------------------------------------------------------------------------------


def chain_plan(kind: str, n: int, tool_name: str) -> dict[str, Any]:
    """``n`` steps of ``kind`` ("tool" or "pure"), each taking the previous step's output."""
    nodes: list[dict[str, Any]] = [{"id": "s0", "type": kind, "tool": tool_name, "args": {"i": 0}}]
    nodes += [
        {
            "id": f"s{k}",
            "type": kind,
            "tool": tool_name,
            "args": {"i": k, "prev": f"${{s{k - 1}}}"},
            "depends_on": [f"s{k - 1}"],
        }
        for k in range(1, n)
    ]
    return {"name": f"bench-steps-{kind}", "nodes": nodes}


def noop(ctx: Any, i: int, prev: Any = None) -> int:
    """The trivial step: returns its index (so outputs stay one small number)."""
    return i


NOOP_TOOL = tool("bench_steps.noop")(noop)
NOOP_PURE = pure("bench_steps.noop_pure")(noop)
REGISTRY = ToolRegistry([NOOP_TOOL, NOOP_PURE])
TOOL_NAMES = {"tool": NOOP_TOOL.name, "pure": NOOP_PURE.name}

# Child processes are small standalone scripts (written to the temporary directory), so that
# whole-process times include only what a real program of that kind imports.

AFFIDAVIT_CHILD = '''\
"""One job of N chained trivial steps on SQLite; prints timings as JSON."""
import json
import sys
import time

t0 = time.perf_counter()
from affidavit import Runtime, ToolRegistry, pure, tool

t_import = time.perf_counter()
db_url, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])


def noop(ctx, i, prev=None):
    return i


decorate = tool if kind == "tool" else pure
registry = ToolRegistry([decorate("noop")(noop)])
rt = Runtime(db_url, tools=registry)
t_open = time.perf_counter()
nodes = [{"id": "s0", "type": kind, "tool": "noop", "args": {"i": 0}}]
nodes += [
    {"id": f"s{k}", "type": kind, "tool": "noop", "args": {"i": k, "prev": f"${{s{k - 1}}}"},
     "depends_on": [f"s{k - 1}"]}
    for k in range(1, n)
]
job = rt.submit({"name": f"bench-steps-{kind}", "nodes": nodes}, {})
t_submit = time.perf_counter()
rt.run_until_idle(concurrency=1)
t_run = time.perf_counter()
status = rt.get_job(job.job_id).status
rt.close()
print(json.dumps({
    "job_id": job.job_id, "status": status, "import_s": t_import - t0,
    "open_s": t_open - t_import, "submit_s": t_submit - t_open, "run_s": t_run - t_submit,
}))
'''

DBOS_CHILD = '''\
"""One DBOS workflow of N chained trivial steps, SQLite system database; prints JSON."""
import json
import sys
import time

t0 = time.perf_counter()
from dbos import DBOS, SetWorkflowID

t_import = time.perf_counter()
path, n, workflow_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
DBOS(config={
    "name": "bench-steps",
    "system_database_url": f"sqlite:///{path}",
    "log_level": "WARNING",
})


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
t_open = time.perf_counter()
with SetWorkflowID(workflow_id):
    result = chain(n)
t_run = time.perf_counter()
durability = {}
try:  # what the system database connection actually runs with (DBOS sets neither)
    from dbos._dbos import _get_dbos_instance

    with _get_dbos_instance()._sys_db.engine.connect() as conn:
        for pragma in ("journal_mode", "synchronous"):
            durability[pragma] = conn.exec_driver_sql(f"PRAGMA {pragma}").scalar()
except Exception as exc:  # private API: report, don't fail
    durability["error"] = repr(exc)
DBOS.destroy()
print(json.dumps({
    "result": result, "import_s": t_import - t0, "open_s": t_open - t_import,
    "run_s": t_run - t_open, "durability": durability,
}))
'''

PG_WORKER_CHILD = '''\
"""A worker process: open the store, wait for "go" on stdin, run until idle, print JSON."""
import json
import sys
import time

from affidavit import ToolRegistry, tool
from affidavit.runtime.worker import Worker
from affidavit.store import open_store

url, tool_name = sys.argv[1], sys.argv[2]


def noop(ctx, i, prev=None):
    return i


registry = ToolRegistry([tool(tool_name)(noop)])
store = open_store(url, migrate=False)
print("ready", flush=True)
sys.stdin.readline()
start = time.monotonic()  # system-wide clock: comparable across the worker processes
worker = Worker(store, registry, lease_seconds=30)
worker.run(until_idle=True)
end = time.monotonic()
store.close()
print(json.dumps({"start": start, "end": end, "jobs": worker.jobs_run}), flush=True)
'''


def write_children(tmp: Path) -> dict[str, Path]:
    scripts = {"affidavit": AFFIDAVIT_CHILD, "dbos": DBOS_CHILD, "pg_worker": PG_WORKER_CHILD}
    paths = {}
    for name, text in scripts.items():
        path = tmp / f"child_{name}.py"
        path.write_text(text, encoding="utf-8")
        paths[name] = path
    return paths


def run_child(script: Path, args: Sequence[str], cwd: Path) -> tuple[dict[str, Any], float]:
    """Run a child script; return its JSON report and the spawn-to-exit time in seconds."""
    gc.collect()
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{script.name} {' '.join(args)} exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{script.name} printed no report:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[-1]), elapsed


# --- results --------------------------------------------------------------------------------


@dataclass(slots=True)
class Case:
    """One SQLite case: steps/s of each repetition, in-process and (for subprocesses) whole."""

    key: str
    label: str
    durability: str
    steps: int
    inproc_s: list[float] = field(default_factory=list)
    whole_s: list[float] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)  # each child's JSON report

    @property
    def inproc_runs(self) -> list[float]:
        return [self.steps / s for s in self.inproc_s]

    @property
    def whole_runs(self) -> list[float]:
        return [self.steps / s for s in self.whole_s]

    @property
    def inproc(self) -> float:
        return median(self.inproc_runs)

    @property
    def whole(self) -> float | None:
        return median(self.whole_runs) if self.whole_s else None

    def detail(self, name: str) -> float | None:
        values = [d[name] for d in self.details if name in d]
        return median(values) if values else None


@dataclass(frozen=True, slots=True)
class Goal:
    label: str
    measured: float | None  # None: the baseline could not be measured
    target: float
    kind: str  # "times" (×) or "share" (%)

    @property
    def met(self) -> bool:
        return self.measured is not None and self.measured >= self.target

    def measured_text(self) -> str:
        if self.measured is None:
            return "not measured"
        return f"{self.measured:.1f}×" if self.kind == "times" else f"{self.measured:.0%}"

    def target_text(self) -> str:
        return f"≥ {self.target:.0f}×" if self.kind == "times" else f"≥ {self.target:.0%}"


@dataclass(slots=True)
class PgResult:
    workers: int
    jobs: int
    steps_per_job: int
    rates: list[float] = field(default_factory=list)  # steps/s of each repetition

    @property
    def rate(self) -> float:
        return median(self.rates)


@dataclass(slots=True)
class DbosInfo:
    version: str | None
    error: str | None = None  # why DBOS was not measured
    durability: dict[str, Any] = field(default_factory=dict)
    persisted: list[int] = field(default_factory=list)  # operation_outputs rows of each run


# --- SQLite: affidavit ----------------------------------------------------------------------


def verify_affidavit(db: Path, report: dict[str, Any], kind: str, n: int) -> None:
    """The child's job completed and every step is on disk (read after the child exited)."""
    if report["status"] != "completed":
        raise RuntimeError(f"affidavit {kind} job ended {report['status']!r}, not completed")
    conn = sqlite3.connect(db)
    try:
        (finished,) = conn.execute(
            "SELECT count(*) FROM events WHERE job_id = ? AND type = 'node_finished'",
            (report["job_id"],),
        ).fetchone()
        (committed,) = conn.execute(
            "SELECT count(*) FROM tool_invocations WHERE job_id = ? AND status = 'committed'",
            (report["job_id"],),
        ).fetchone()
    finally:
        conn.close()
    expected_committed = n if kind == "tool" else 0
    if finished != n or committed != expected_committed:
        raise RuntimeError(
            f"affidavit {kind} job: {finished} node_finished events (want {n}), "
            f"{committed} committed ledger rows (want {expected_committed})"
        )


def run_affidavit(case: Case, kind: str, tmp: Path, script: Path, rep: int) -> None:
    db = tmp / f"affidavit_{kind}_{rep}.db"
    report, whole = run_child(script, [f"sqlite:///{db}", kind, str(case.steps)], tmp)
    verify_affidavit(db, report, kind, case.steps)
    case.inproc_s.append(report["run_s"])
    case.whole_s.append(whole)
    case.details.append(report)


# --- SQLite: DBOS ---------------------------------------------------------------------------


def dbos_version() -> tuple[str | None, str | None]:
    """(version, None) if ``dbos`` imports in this interpreter, else (None, the reason)."""
    try:
        version = importlib.metadata.version("dbos")
    except importlib.metadata.PackageNotFoundError:
        return None, "the `dbos` package is not installed (pip install dbos)"
    check = subprocess.run(
        [sys.executable, "-c", "import dbos"], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        lines = check.stderr.strip().splitlines()
        return None, f"dbos {version} does not import: {lines[-1] if lines else 'unknown error'}"
    return version, None


def run_dbos(case: Case, info: DbosInfo, tmp: Path, script: Path, rep: int) -> None:
    db = tmp / f"dbos_{rep}.sqlite"
    workflow_id = f"bench-steps-{rep}-{secrets.token_hex(4)}"
    report, whole = run_child(script, [str(db), str(case.steps), workflow_id], tmp)
    if report["result"] != case.steps - 1:
        raise RuntimeError(f"DBOS workflow returned {report['result']!r}")
    conn = sqlite3.connect(db)  # after the process exited: what DBOS actually persisted
    try:
        (steps,) = conn.execute(
            "SELECT count(*) FROM operation_outputs WHERE workflow_uuid = ?", (workflow_id,)
        ).fetchone()
        row = conn.execute(
            "SELECT status FROM workflow_status WHERE workflow_uuid = ?", (workflow_id,)
        ).fetchone()
    finally:
        conn.close()
    if steps != case.steps or row is None or row[0] != "SUCCESS":
        raise RuntimeError(
            f"DBOS persisted {steps} step outputs (want {case.steps}), workflow status {row}"
        )
    info.persisted.append(steps)
    info.durability = report.get("durability", {})
    case.inproc_s.append(report["run_s"])
    case.whole_s.append(whole)
    case.details.append(report)


# --- SQLite: the floor ----------------------------------------------------------------------


def run_floor(case: Case, tmp: Path, rep: int) -> None:
    """Per step: one synced single-row commit and one written (not synced) single-row commit,
    on one connection to a fresh WAL file — the cheapest form: autocommit INSERTs."""
    path = tmp / f"floor_{rep}.db"
    conn = apsw.Connection(str(path))  # the store's SQLite driver
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        conn.execute(
            "CREATE TABLE steps (id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, "
            "step INTEGER NOT NULL, payload BLOB NOT NULL)"
        )
        insert = "INSERT INTO steps (job_id, step, payload) VALUES (?, ?, ?)"

        def steps(n: int, job: str) -> float:
            gc.collect()
            start = time.perf_counter()
            for i in range(n):
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute(insert, (job, i, FLOOR_PAYLOAD))  # T1: synced
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute(insert, (job, i, FLOOR_PAYLOAD))  # T2: written
            return time.perf_counter() - start

        steps(20, "warm-up")
        case.inproc_s.append(steps(case.steps, "floor"))
    finally:
        conn.close()


# --- plan validation cost -------------------------------------------------------------------


def plan_parse_seconds(n: int, reps: int = 3) -> float:
    """Median time of ``Plan.parse`` of an ``n``-step chained plan (also run at job start)."""
    data = chain_plan("tool", n, TOOL_NAMES["tool"])
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        Plan.parse(data)
        times.append(time.perf_counter() - start)
    return median(times)


# --- PostgreSQL -----------------------------------------------------------------------------


def pg_server_version(url: str) -> str | None:
    """The server version, or ``None`` if PostgreSQL cannot be reached (reported, skipped)."""
    try:
        with psycopg.connect(pg_conninfo(url), connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except psycopg.Error as exc:
        console.print(
            f"[yellow]PostgreSQL unreachable at {redact(url)}: {str(exc).strip()}; "
            "skipping the PostgreSQL cases[/yellow]"
        )
        return None
    return str(row[0]) if row else "unknown"


@contextmanager
def pg_schema(url: str) -> Iterator[str]:
    """A store URL in a fresh schema, dropped afterwards."""
    conninfo = pg_conninfo(url)
    schema = f"bench_steps_{secrets.token_hex(4)}"
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}schema={schema}"
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def pg_run(url: str, sizes: Sizes, workers: int, script: Path, tmp: Path) -> float:
    """Submit ``pg_jobs`` jobs (not timed), start ``workers`` worker processes, let them all
    begin at once, and return steps/s from the first start to the last finish."""
    with pg_schema(url) as store_url:
        rt = Runtime(store_url, tools=REGISTRY)
        try:
            plan = Plan.parse(chain_plan("tool", sizes.pg_steps, TOOL_NAMES["tool"]))
            for _ in range(sizes.pg_jobs):
                rt.submit(plan, {})
        finally:
            rt.close()
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), store_url, TOOL_NAMES["tool"]],
                cwd=tmp,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        try:
            for p in procs:  # every worker has imported and connected
                assert p.stdout is not None
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"PostgreSQL worker failed to start:\n{p.communicate()[1]}")
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            reports = []
            for p in procs:
                out, err = p.communicate(timeout=CHILD_TIMEOUT_S)
                if p.returncode != 0:
                    raise RuntimeError(f"PostgreSQL worker exited {p.returncode}:\n{err[-3000:]}")
                reports.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        span = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        conninfo, schema = split_url(store_url)
        with psycopg.connect(conninfo) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema or "")))
            (done,) = conn.execute(
                "SELECT count(*) FROM jobs WHERE status = 'completed'"
            ).fetchone()
            (committed,) = conn.execute(
                "SELECT count(*) FROM tool_invocations WHERE status = 'committed'"
            ).fetchone()
        steps = sizes.pg_jobs * sizes.pg_steps
        if done != sizes.pg_jobs or committed != steps:
            raise RuntimeError(
                f"PostgreSQL: {done}/{sizes.pg_jobs} jobs completed, {committed}/{steps} steps"
            )
        if sum(r["jobs"] for r in reports) != sizes.pg_jobs:
            raise RuntimeError("PostgreSQL: the workers' job counts do not add up")
    return steps / span


def run_postgres(url: str, sizes: Sizes, script: Path, tmp: Path) -> list[PgResult]:
    results = {w: PgResult(w, sizes.pg_jobs, sizes.pg_steps) for w in sizes.pg_workers}
    for rep in range(sizes.pg_reps):
        order = list(sizes.pg_workers) if rep % 2 == 0 else list(reversed(sizes.pg_workers))
        for w in order:
            rate = pg_run(url, sizes, w, script, tmp)
            results[w].rates.append(rate)
            console.print(f"    PostgreSQL, {workers_text(w)}: {rate:,.0f} steps/s")
    return [results[w] for w in sizes.pg_workers]


# --- the whole measurement ------------------------------------------------------------------


@dataclass(slots=True)
class Results:
    sqlite_cases: dict[str, Case]
    dbos: DbosInfo
    pg: list[PgResult]
    parse_full_s: float
    parse_quarter_s: float
    filesystem: str


def filesystem_of(path: Path) -> str:
    """``/dev/vda (ext4)``: the mount that holds ``path``, from ``/proc/mounts``."""
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return "unknown"
    target = str(path.resolve())
    best = ("", "unknown", "unknown")
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount, fstype = parts[0], parts[1], parts[2]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, device, fstype)
    return f"{best[1]} ({best[2]}, mounted at {best[0]})"


def measure(sizes: Sizes, pg_url: str | None) -> Results:
    version, error = dbos_version()
    dbos = DbosInfo(version, error)
    if error:
        console.print(f"[yellow]DBOS not measured: {error}[/yellow]")
    n = sizes.steps
    cases = {
        "tool": Case(
            "tool",
            "affidavit, durable `tool` steps",
            "T1 synced (`synchronous=FULL`) + T2 written (`NORMAL`), WAL",
            n,
        ),
        "pure": Case(
            "pure", "affidavit, `pure` steps", "one written (`NORMAL`) transaction, WAL", n
        ),
        "dbos": Case("dbos", f"DBOS Transact {version or ''} `@DBOS.step()`".strip(), "", n),
        "floor": Case(
            "floor",
            "Floor: 1 synced + 1 written single-row commit",
            "`synchronous=FULL` commit + `NORMAL` commit, WAL",
            n,
        ),
    }
    with tempfile.TemporaryDirectory(prefix="bench_steps_") as tmp_name:
        tmp = Path(tmp_name)
        fs = filesystem_of(tmp)
        scripts = write_children(tmp)
        reps = max(sizes.reps, sizes.dbos_reps)
        for rep in range(reps):
            jobs: list[tuple[str, Callable[[], None]]] = []
            if rep < sizes.reps:
                jobs += [
                    (
                        "tool",
                        lambda r=rep: run_affidavit(
                            cases["tool"], "tool", tmp, scripts["affidavit"], r
                        ),
                    ),
                    (
                        "pure",
                        lambda r=rep: run_affidavit(
                            cases["pure"], "pure", tmp, scripts["affidavit"], r
                        ),
                    ),
                    ("floor", lambda r=rep: run_floor(cases["floor"], tmp, r)),
                ]
            if rep < sizes.dbos_reps and dbos.error is None:
                jobs.append(
                    ("dbos", lambda r=rep: run_dbos(cases["dbos"], dbos, tmp, scripts["dbos"], r))
                )
            shift = rep % len(jobs)  # rotate the order so no case always runs first
            for key, job in jobs[shift:] + jobs[:shift]:
                job()
                case = cases[key]
                whole = f", whole-process {case.whole_runs[-1]:,.0f}" if case.whole_s else ""
                console.print(
                    f"  rep {rep + 1}: {case.label}: in-process "
                    f"{case.inproc_runs[-1]:,.0f}{whole} steps/s"
                )
        parse_full = plan_parse_seconds(n)
        parse_quarter = plan_parse_seconds(max(n // 4, 1))
        pg: list[PgResult] = []
        if pg_url is not None:
            console.print(
                f"  PostgreSQL: {sizes.pg_jobs} jobs × {sizes.pg_steps} tool steps, "
                f"workers {sizes.pg_workers}, {sizes.pg_reps} repetition(s)"
            )
            pg = run_postgres(pg_url, sizes, scripts["pg_worker"], tmp)
    if dbos.error is not None:
        del cases["dbos"]
    return Results(cases, dbos, pg, parse_full, parse_quarter, fs)


def goals(results: Results) -> list[Goal]:
    cases = results.sqlite_cases
    tool_case = cases["tool"]
    dbos = cases.get("dbos")
    inproc = tool_case.inproc / dbos.inproc if dbos is not None else None
    whole = (
        tool_case.whole / dbos.whole
        if dbos is not None and tool_case.whole is not None and dbos.whole is not None
        else None
    )
    return [
        Goal("Tool steps/s ÷ DBOS steps/s, in-process", inproc, GOAL_VS_DBOS, "times"),
        Goal("Tool steps/s ÷ DBOS steps/s, whole-process", whole, GOAL_VS_DBOS, "times"),
        Goal(
            "Tool steps/s ÷ floor steps/s, in-process",
            tool_case.inproc / cases["floor"].inproc,
            GOAL_VS_FLOOR,
            "share",
        ),
    ]


# --- profile --------------------------------------------------------------------------------

Stats = dict[ProfileKey, tuple[Any, ...]]  # (cc, nc, tottime, cumtime, callers)


class TracedCursor:
    """Wraps the store's SQLite writer cursor so that cProfile sees BEGIN, COMMIT (synced or
    only written), PRAGMA and other statements as separate functions. Profile mode only."""

    def __init__(self, cursor: apsw.Cursor) -> None:
        self._conn = cursor
        self._synced = True

    def execute(self, statement: str, params: Sequence[Any] = ()) -> apsw.Cursor:
        if statement == "COMMIT":
            return self.commit_synced() if self._synced else self.commit_written()
        if statement.startswith("BEGIN"):
            return self.begin(statement)
        if statement.startswith("PRAGMA synchronous"):
            self._synced = statement.endswith("FULL")
            return self.pragma(statement)
        return self.statement(statement, params)

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> apsw.Cursor:
        return self._conn.executemany(statement, rows)

    def commit_synced(self) -> apsw.Cursor:
        return self._conn.execute("COMMIT")

    def commit_written(self) -> apsw.Cursor:
        return self._conn.execute("COMMIT")

    def begin(self, statement: str) -> apsw.Cursor:
        return self._conn.execute(statement)

    def pragma(self, statement: str) -> apsw.Cursor:
        return self._conn.execute(statement)

    def statement(self, statement: str, params: Sequence[Any]) -> apsw.Cursor:
        return self._conn.execute(statement, params)


def _any(*preds: Callable[[ProfileKey], bool]) -> Callable[[ProfileKey], bool]:
    return lambda k: any(p(k) for p in preds)


def _cum(stats: Stats, match: Callable[[ProfileKey], bool]) -> float:
    return sum(v[3] for k, v in stats.items() if match(k))


def _cum_from(
    stats: Stats, callee: Callable[[ProfileKey], bool], caller: Callable[[ProfileKey], bool]
) -> float:
    """Cumulative time of ``callee`` when called directly by ``caller``."""
    total = 0.0
    for k, v in stats.items():
        if callee(k):
            total += sum(c[3] for ck, c in v[4].items() if caller(ck))
    return total


RUNNER = "affidavit/runtime/runner.py"
PLAN = "affidavit/core/plan.py"
SQL = "affidavit/store/_sql.py"
LEDGER = "affidavit/store/_ledger.py"
BENCH = "benchmarks/bench_steps.py"
_canonical = function_matcher("canonical", "affidavit/core/canonical.py")
_sql_call = _any(builtin_matcher("of 'apsw.Connection'"), builtin_matcher("of 'apsw.Cursor'"))

# (label, top-level?, how to total it). Top-level rows are disjoint parts of the run; indented
# rows are parts of the row above; "all callers" rows overlap the others (shown for reference).
PROFILE_PARTS: list[tuple[str, bool, Callable[[Stats], float]]] = [
    (
        "job start: Plan.parse + step ids (once per job; linear in the plan)",
        True,
        lambda s: _cum(
            s, _any(function_matcher("parse", PLAN), function_matcher("step_ids", PLAN))
        ),
    ),
    (
        "job start: claim, read the log, replay",
        True,
        lambda s: _cum(
            s,
            _any(
                function_matcher("claim", "affidavit/runtime/worker.py"),
                function_matcher("list_events", SQL),
                function_matcher("build_from_events", "affidavit/runtime/replay.py"),
            ),
        ),
    ),
    ("plan.node(id) lookup (linear scan)", True, lambda s: _cum(s, function_matcher("node", PLAN))),
    (
        "args: resolve ${…} + canonical check",
        True,
        lambda s: _cum(s, function_matcher("_resolve_args", RUNNER)),
    ),
    (
        "keys: idempotency_key + args_hash ×2 (canonical JSON + SHA-256)",
        True,
        lambda s: _cum(
            s, _any(function_matcher("idempotency_key", PLAN), function_matcher("args_hash", PLAN))
        ),
    ),
    (
        "uuid: new_event_id() (invocation id, when made alone)",
        True,
        lambda s: _cum(s, function_matcher("new_event_id", "affidavit/core/ids.py")),
    ),
    (
        "event payloads: _events() (utc_now + dict copies)",
        True,
        lambda s: _cum(s, function_matcher("_events", RUNNER)),
    ),
    (
        "event append: tx.append (encode, head, chain, INSERT)",
        True,
        lambda s: _cum(s, function_matcher("append", SQL)),
    ),
    (
        "  canonical JSON of the event payloads",
        False,
        lambda s: _cum_from(s, _canonical, function_matcher("encode_events", SQL)),
    ),
    (
        "  ids: new_event_ids() (uuid7: invocation id + event ids)",
        False,
        lambda s: _cum(s, function_matcher("new_event_ids", "affidavit/core/ids.py")),
    ),
    (
        "  SQL: SELECT job + head",
        False,
        lambda s: _cum(s, function_matcher("_lock_and_head", "affidavit/store/sqlite.py")),
    ),
    (
        "  chain_events() (SHA-256 chain)",
        False,
        lambda s: _cum(s, function_matcher("chain_events", SQL)),
    ),
    (
        "  SQL: the append's guard (job, fence, previous row)",
        False,
        lambda s: _cum_from(
            s, _sql_call, function_matcher("_append_after_head", "affidavit/store/sqlite.py")
        ),
    ),
    (
        "  SQL: INSERT events",
        False,
        lambda s: _cum(s, function_matcher("_insert_chunks", "affidavit/store/sqlite.py")),
    ),
    (
        "ledger SQL: get + insert (T1), finish (T2)",
        True,
        lambda s: _cum(
            s,
            _any(
                function_matcher("ledger_get", LEDGER),
                function_matcher("ledger_insert", LEDGER),
                function_matcher("ledger_finish", LEDGER),
            ),
        ),
    ),
    (
        "transaction start: PRAGMA synchronous switch + BEGIN IMMEDIATE",
        True,
        lambda s: _cum(
            s, _any(function_matcher("pragma", BENCH), function_matcher("begin", BENCH))
        ),
    ),
    (
        "T1 COMMIT (synced: fsync of the WAL)",
        True,
        lambda s: _cum(s, function_matcher("commit_synced", BENCH)),
    ),
    (
        "T2 COMMIT (written, not synced)",
        True,
        lambda s: _cum(s, function_matcher("commit_written", BENCH)),
    ),
    (
        "result: canonical(result) + canonical_sha256(result)",
        True,
        lambda s: (
            _cum_from(s, _canonical, function_matcher("_tool_step", RUNNER))
            + _cum(s, function_matcher("canonical_sha256", "affidavit/core/canonical.py"))
        ),
    ),
    ("the tool itself (noop)", True, lambda s: _cum(s, function_matcher("noop", BENCH))),
    ("all callers: canonical() JSON", False, lambda s: _cum(s, _canonical)),
    ("all callers: SHA-256", False, lambda s: _cum(s, builtin_matcher("openssl_sha256"))),
    (
        "all callers: uuid7 ids",
        False,
        lambda s: _cum(
            s,
            _any(
                function_matcher("new_event_id", "affidavit/core/ids.py"),
                function_matcher("new_event_ids", "affidavit/core/ids.py"),
                function_matcher("new_attempt_id", "affidavit/core/ids.py"),
            ),
        ),
    ),
    (
        "all callers: utc_now()",
        False,
        lambda s: _cum(s, function_matcher("utc_now", "core/events.py")),
    ),
    ("all callers: SQLite driver calls (incl. COMMIT)", False, lambda s: _cum(s, _sql_call)),
]


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """What one tool step of a finished job wrote, ready to be written again."""

    key: str
    node_id: str
    step_id: str
    tool_name: str
    args_hash: str
    invocation_id: str
    t1: tuple[tuple[str, dict[str, Any]], ...]  # (type, payload) of T1's events
    t2: tuple[tuple[str, dict[str, Any]], ...]
    result: Any


def recorded_steps(store: Any, job_id: str) -> list[RecordedStep]:
    """The job's tool steps, from its log, in order."""
    by_node: dict[str, dict[str, Any]] = {}
    for event in store.list_events(job_id):
        payload = event.payload
        node_id = payload.get("node_id") if isinstance(payload, dict) else None
        if node_id is None:
            continue
        step = by_node.setdefault(node_id, {"t1": [], "t2": []})
        if event.type in ("node_started", "tool_invocation_started"):
            step["t1"].append((event.type, payload))
        else:
            step["t2"].append((event.type, payload))
        if event.type == "tool_invocation_started":
            step["started"] = payload
        if event.type == "tool_invocation_finished":
            step["result"] = payload.get("result")
    out = []
    for step in by_node.values():
        started = step["started"]
        out.append(
            RecordedStep(
                key=started["idempotency_key"],
                node_id=started["node_id"],
                step_id=started["step_id"],
                tool_name=started["tool_name"],
                args_hash=started["args_hash"],
                invocation_id=started["invocation_id"],
                t1=tuple(step["t1"]),
                t2=tuple(step["t2"]),
                result=step.get("result"),
            )
        )
    return out


def store_layer_seconds(path: str, steps: Sequence[RecordedStep]) -> float:
    """The same two transactions per step through the store's Transaction API (ledger insert +
    append T1 synced; append T2 + ledger finish written), with the events already
    canonicalized and their ids made: the store's share of a tool step, without the runner."""
    store = open_store(f"sqlite:///{path}")
    try:
        job, _ = store.create_job(plan_name="bench-store-layer")
        attempt = new_attempt_id()
        with store.transaction(durable=True) as tx:
            tx.claim(
                owner="bench",
                attempt_id=attempt,
                now=time.time(),
                lease_seconds=3600,
                job_id=job.job_id,
            )
        prepared = []
        for s in steps:
            ids = iter(new_event_ids(len(s.t1) + len(s.t2)))
            t1 = [(next(ids), t, canonical(p)) for t, p in s.t1]
            t2 = [(next(ids), t, canonical(p)) for t, p in s.t2]
            prepared.append((s, t1, t2))
        job_id, version, head = job.job_id, job.version, GENESIS
        gc.collect()
        start = time.perf_counter()
        for s, t1, t2 in prepared:
            # as the runner does: the insert first (no read on the usual path), appends after
            # the head it holds
            with store.transaction(durable=True) as tx:
                tx.ledger_insert(
                    job_id=job_id,
                    key=s.key,
                    node_id=s.node_id,
                    step_id=s.step_id,
                    tool_name=s.tool_name,
                    args_hash=s.args_hash,
                    invocation_id=s.invocation_id,
                    attempt_id=attempt,
                )
                stored = tx.append_encoded(
                    job_id, t1, expected_version=version, fence=attempt, head=head
                )
            version, head = version + len(t1), bytes.fromhex(stored[-1].chain_hash)
            with store.transaction(durable=False) as tx:
                stored = tx.append_encoded(
                    job_id, t2, expected_version=version, fence=attempt, head=head
                )
                tx.ledger_finish(job_id, s.key, status="committed", result=s.result)
            version, head = version + len(t2), bytes.fromhex(stored[-1].chain_hash)
        return time.perf_counter() - start
    finally:
        store.close()


# The statements of a durable tool step on SQLite, as the store issues them (sqlite.py and
# _ledger.py), for replaying them through the bare SQLite driver.
_RAW_LEDGER_INSERT = (
    "INSERT INTO tool_invocations (job_id, idempotency_key, node_id, step_id, tool_name, "
    "args_hash, status, invocation_id, attempt_id, tries, result, error, created_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, 'started', ?, ?, 1, NULL, NULL, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
_RAW_LEDGER_FINISH = (
    "UPDATE tool_invocations SET status = ?, result = ?, error = ?, updated_at = ? "
    "WHERE job_id = ? AND idempotency_key = ? AND status <> 'committed'"
)


def raw_sql_seconds(path: str, steps: Sequence[RecordedStep]) -> float:
    """The SQL of the same two transactions per step through the bare driver (``apsw``, as the
    store uses it) on the store's schema
    — no affidavit code on the timed path: what the protocol's statements cost by themselves."""
    open_store(f"sqlite:///{path}").close()  # the schema
    conn = apsw.Connection(path)  # the store's SQLite driver
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        job_id, attempt, now = "raw-job", new_attempt_id(), utc_now()
        conn.execute(
            "INSERT INTO jobs (job_id, namespace, status, created_at, updated_at, attempt_id) "
            "VALUES (?, 'default', 'running', ?, ?, ?)",
            (job_id, now, now, attempt),
        )
        (number,) = conn.execute(_JOB_NUMBER, (job_id,)).fetchone()
        head, version, prepared = GENESIS, 0, []
        for s in steps:
            rows: list[tuple[tuple[Any, ...], str, list[Any]]] = []
            for events in (s.t1, s.t2):
                params: list[Any] = []
                guard = (version, version, job_id)
                for event_id, (kind, payload) in zip(
                    new_event_ids(len(events)), events, strict=True
                ):
                    data = canonical(payload)
                    head, version = chain_next(head, event_id, kind, data), version + 1
                    seq = (number << 32) + version
                    params += (seq, job_id, version, event_id, kind, data, head.hex(), now)
                rows.append((guard, _insert_rows(len(events)), params))
            ledger_row = (job_id, s.key, s.node_id, s.step_id, s.tool_name, s.args_hash)
            result = canonical(s.result).decode()
            prepared.append(
                ((*ledger_row, s.invocation_id, attempt, now, now), rows, result, s.key)
            )
        execute, changes = conn.execute, conn.changes
        gc.collect()
        start = time.perf_counter()
        for ledger_row, ((g1, sql1, t1), (g2, sql2, t2)), result, key in prepared:
            execute("PRAGMA synchronous=FULL")
            execute("BEGIN IMMEDIATE")
            execute(_RAW_LEDGER_INSERT, ledger_row)
            if changes() != 1:
                raise RuntimeError("the ledger insert lost")
            execute(_GUARD, g1).fetchone()
            execute(sql1, t1)
            execute("COMMIT")
            execute("PRAGMA synchronous=NORMAL")
            execute("BEGIN IMMEDIATE")
            execute(_GUARD, g2).fetchone()
            execute(sql2, t2)
            execute(_RAW_LEDGER_FINISH, ("committed", result, None, now, job_id, key))
            execute("COMMIT")
        return time.perf_counter() - start
    finally:
        conn.close()


def cpu_parts(
    plan_data: dict[str, Any], job_id: str, steps: Sequence[RecordedStep]
) -> list[tuple[str, float]]:
    """CPU parts of a tool step timed alone (no profiler, no database), µs/step (median of 3)."""
    n = len(steps)
    plan = Plan.parse(plan_data)
    scope: dict[str, Any] = {"input": {}, **{node_id: i for i, node_id in enumerate(plan.order)}}
    resolved = [resolve(dict(node.args), scope, node.id) for node in plan.nodes]
    payloads = [p for s in steps for _, p in (*s.t1, *s.t2)]
    encoded = [(new_event_id(), t, canonical(p)) for s in steps for t, p in (*s.t1, *s.t2)]
    events_per_step = len(encoded) / n

    def chain() -> None:
        prev = GENESIS
        for event_id, event_type, payload in encoded:
            prev = chain_next(prev, event_id, event_type, payload)

    def keys() -> None:
        for s, args in zip(steps, resolved, strict=True):
            idempotency_key(job_id, s.step_id, s.tool_name, args)
            args_hash(args)
            args_hash(args)

    def results() -> None:
        for s in steps:
            canonical(s.result)
            canonical_sha256(s.result)
            canonical(s.result)

    parts: list[tuple[str, Callable[[], object]]] = [
        ("Plan.parse at job start (÷ steps; once per job)", lambda: Plan.parse(plan_data)),
        ("plan.node(id) once per step (linear scan)", lambda: [plan.node(i) for i in plan.order]),
        (
            "resolve ${…} args + canonical check",
            lambda: [canonical(resolve(dict(nd.args), scope, nd.id)) for nd in plan.nodes],
        ),
        ("idempotency_key + args_hash ×2 (canonical + SHA-256)", keys),
        (
            f"canonical JSON of the step's {events_per_step:.0f} event payloads",
            lambda: [canonical(p) for p in payloads],
        ),
        (f"SHA-256 chain of {events_per_step:.0f} events", chain),
        (
            f"uuid7: 1 invocation id + {events_per_step:.0f} event ids (2 calls)",
            lambda: [(new_event_ids(3), new_event_ids(3)) for _ in range(n)],
        ),
        ("utc_now() ×4", lambda: [utc_now() for _ in range(4 * n)]),
        ("result: canonical ×2 + canonical_sha256", results),
    ]
    out = []
    for label, fn in parts:
        times = []
        for _ in range(3):
            gc.collect()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        out.append((label, median(times) / n * 1e6))
    return out


def run_profile(sizes: Sizes) -> None:
    """Where a durable tool step's time goes, in µs per step: a cProfile of the in-process
    SQLite run, then (without the profiler) the run vs the store layer alone vs the floor, and
    the CPU parts timed alone."""
    n = sizes.steps
    plan_data = chain_plan("tool", n, TOOL_NAMES["tool"])
    with tempfile.TemporaryDirectory(prefix="bench_steps_profile_") as tmp:
        plain_s, store_s, raw_s, floor_s = [], [], [], []
        steps: list[RecordedStep] = []
        job_id = ""
        for i in range(3):  # without the profiler; layers interleaved
            rt = Runtime(f"sqlite:///{tmp}/plain_{i}.db", tools=REGISTRY)
            try:
                job = rt.submit(plan_data, {})
                gc.collect()
                start = time.perf_counter()
                rt.run_until_idle()
                plain_s.append(time.perf_counter() - start)
                if rt.get_job(job.job_id).status != "completed":
                    raise RuntimeError("the job did not complete")
                if not steps:
                    steps, job_id = recorded_steps(rt.store, job.job_id), job.job_id
            finally:
                rt.close()
            store_s.append(store_layer_seconds(f"{tmp}/store_{i}.db", steps))
            raw_s.append(raw_sql_seconds(f"{tmp}/raw_{i}.db", steps))
            floor = Case("floor", "floor", "", n)
            run_floor(floor, Path(tmp), i)
            floor_s.append(floor.inproc_s[0])

        rt = Runtime(f"sqlite:///{tmp}/profile.db", tools=REGISTRY)
        try:
            store: Any = rt.store
            if hasattr(store, "_writer_cursor"):  # split BEGIN / COMMIT / PRAGMA in the profile
                store._writer_cursor = TracedCursor(store._writer_cursor)
            job = rt.submit(plan_data, {})
            profiler = cProfile.Profile()
            gc.collect()
            start = time.perf_counter()
            profiler.enable()
            rt.run_until_idle()
            profiler.disable()
            profiled = time.perf_counter() - start
            if rt.get_job(job.job_id).status != "completed":
                raise RuntimeError("the profiled job did not complete")
        finally:
            rt.close()
    parts = cpu_parts(plan_data, job_id, steps)

    stats: Stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    table = Table(title=f"cProfile: one job of {n:,} durable tool steps, SQLite, in-process")
    table.add_column("part")
    table.add_column("µs/step", justify="right")
    table.add_column("share", justify="right")
    table.add_row("total under cProfile", f"{profiled / n * 1e6:.0f}", "100%")
    accounted = 0.0
    for label, top, total in PROFILE_PARTS:
        cum = total(stats)
        if cum == 0:
            continue
        accounted += cum if top else 0.0
        table.add_row(label, f"{cum / n * 1e6:.1f}", f"{cum / profiled:.0%}")
    rest = profiled - accounted
    table.add_row(
        "other (runner glue, job completion, profiler overhead)", f"{rest / n * 1e6:.1f}", ""
    )
    console.print(table)
    console.print(
        "cProfile inflates parts made of many small Python calls (canonical JSON's value "
        "check, uuid, replay) far more than single C calls (fsync); the tables below are "
        "measured without it.\n"
    )

    run_us, store_us, raw_us, floor_us = (
        median(x) / n * 1e6 for x in (plain_s, store_s, raw_s, floor_s)
    )
    table = Table(title="Without the profiler: µs per durable tool step (median of 3)")
    table.add_column("layer")
    table.add_column("µs/step", justify="right")
    table.add_column("steps/s", justify="right")
    table.add_row("the run: Runtime.run_until_idle()", f"{run_us:.0f}", f"{1e6 / run_us:,.0f}")
    table.add_row(
        "store layer alone: same 2 transactions via the Transaction API, events pre-encoded",
        f"{store_us:.0f}",
        f"{1e6 / store_us:,.0f}",
    )
    table.add_row(
        "the same SQL through the bare SQLite driver (no affidavit code; statements as the "
        "store issues them)",
        f"{raw_us:.0f}",
        f"{1e6 / raw_us:,.0f}",
    )
    table.add_row(
        "floor: 1 synced + 1 written single-row commit", f"{floor_us:.0f}", f"{1e6 / floor_us:,.0f}"
    )
    table.add_row("→ runner + encoding (run − store layer)", f"{run_us - store_us:.0f}", "")
    table.add_row("→ store code (store layer − plain SQL)", f"{store_us - raw_us:.0f}", "")
    table.add_row(
        "→ the protocol's SQL beyond the floor (plain SQL − floor)", f"{raw_us - floor_us:.0f}", ""
    )
    table.add_row("plain SQL as a share of the floor's steps/s", f"{floor_us / raw_us:.0%}", "")
    console.print(table)
    console.print(
        "runs (steps/s): "
        + "; ".join(
            f"{name} {', '.join(f'{n / s:,.0f}' for s in xs)}"
            for name, xs in (
                ("run", plain_s),
                ("store layer", store_s),
                ("plain SQL", raw_s),
                ("floor", floor_s),
            )
        )
    )
    table = Table(title="CPU parts of a tool step, timed alone (no profiler, no database)")
    table.add_column("part")
    table.add_column("µs/step", justify="right")
    for label, us in parts:
        table.add_row(label, f"{us:.1f}")
    table.add_row("sum", f"{sum(us for _, us in parts):.1f}")
    console.print(table)


# --- report ---------------------------------------------------------------------------------


def bullet(text: str) -> str:
    """A markdown list item wrapped at 100 columns."""
    return textwrap.fill(
        text,
        width=100,
        initial_indent="- ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def workers_text(n: int) -> str:
    return f"{n} worker process" if n == 1 else f"{n} worker processes"


def dbos_durability(info: DbosInfo) -> str:
    d = info.durability
    if not d or "error" in d:
        return "SQLite defaults (DBOS sets no `journal_mode` or `synchronous`)"
    sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(d.get("synchronous"), "?")
    return f"its default: `journal_mode={d.get('journal_mode')}`, `synchronous={sync}`"


SQLITE_HEADERS = [
    "Case",
    "Durability per step",
    "In-process steps/s",
    "Whole-process steps/s",
    "Whole-process s",
]
GOAL_HEADERS = ["Goal", "Measured", "Target", "Met?"]
PG_HEADERS = ["Worker processes", "Jobs × tool steps", "Steps/s", "vs 1 worker"]


def sqlite_rows(results: Results) -> list[list[str]]:
    rows = []
    for key, case in results.sqlite_cases.items():
        durability = dbos_durability(results.dbos) if key == "dbos" else case.durability
        whole_s = f"{median(case.whole_s):.2f}" if case.whole_s else "—"
        rows.append([case.label, durability, fmt_rate(case.inproc), fmt_rate(case.whole), whole_s])
    return rows


def goal_rows(gs: Sequence[Goal]) -> list[list[str]]:
    return [[g.label, g.measured_text(), g.target_text(), yes_no(g.met)] for g in gs]


def pg_rows(pg: Sequence[PgResult]) -> list[list[str]]:
    base = pg[0].rate if pg else 0.0
    return [
        [
            str(r.workers),
            f"{r.jobs:,} × {r.steps_per_job}",
            fmt_rate(r.rate),
            f"{r.rate / base:.2f}×" if base else "—",
        ]
        for r in pg
    ]


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 or h in ("Durability per step",) else "right")
    for row in rows:
        table.add_row(*[c.replace("**", "").replace("`", "") for c in row])
    console.print(table)


def print_results(results: Results, gs: Sequence[Goal], sizes: Sizes) -> None:
    print_table(
        f"SQLite: one job of {sizes.steps:,} trivial chained steps (median)",
        SQLITE_HEADERS,
        sqlite_rows(results),
    )
    print_table("Goals", GOAL_HEADERS, goal_rows(gs))
    if results.pg:
        print_table("PostgreSQL: many jobs (median)", PG_HEADERS, pg_rows(results.pg))


def notes(results: Results, sizes: Sizes) -> tuple[str, str]:
    cases = results.sqlite_cases
    tool_case, pure_case = cases["tool"], cases["pure"]
    lines = []
    for case in cases.values():
        whole = f"; whole-process {spread(case.whole_runs)}" if case.whole_s else ""
        lines.append(bullet(f"{case.label}: in-process {spread(case.inproc_runs)}{whole}"))
    dbos_case = cases.get("dbos")
    if dbos_case is not None and dbos_case.inproc_s:
        # Each repetition runs affidavit and DBOS seconds apart: the ratio within a repetition
        # is not moved by the disk getting faster or slower between repetitions.
        def ratios(ours: list[float], theirs: list[float]) -> str:
            return ", ".join(f"{b / a:.1f}×" for a, b in zip(ours, theirs, strict=False))

        lines.append(
            bullet(
                "Tool steps/s ÷ DBOS steps/s within each repetition (the two run seconds apart): "
                f"in-process {ratios(tool_case.inproc_s, dbos_case.inproc_s)}; whole-process "
                f"{ratios(tool_case.whole_s, dbos_case.whole_s)}"
            )
        )
    ranges = "\n".join(lines) + "\n"

    def s(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f} s"

    startup = [
        f"affidavit child (tool job): import {s(tool_case.detail('import_s'))}, open the "
        f"database {s(tool_case.detail('open_s'))}, submit (build + validate + write the "
        f"{sizes.steps:,}-step plan) {s(tool_case.detail('submit_s'))}; pure job: submit "
        f"{s(pure_case.detail('submit_s'))}"
    ]
    dbos = cases.get("dbos")
    if dbos is not None:
        startup.append(
            f"DBOS child: import {s(dbos.detail('import_s'))}, configure + launch "
            f"{s(dbos.detail('open_s'))}"
        )
    growth = results.parse_full_s / results.parse_quarter_s if results.parse_quarter_s else 0.0
    quarter = max(sizes.steps // 4, 1)
    startup.append(
        f"`Plan.parse` of the chained plan: {results.parse_quarter_s * 1e3:,.0f} ms at "
        f"{quarter:,} steps, {results.parse_full_s * 1e3:,.0f} ms at {sizes.steps:,} steps "
        f"(×{growth:.1f} for 4× the steps"
        + ("; super-linear" if growth > 6 else "")
        + "). Submit validates the plan, and the runner parses it again when it claims the job, "
        "so the second parse is inside the in-process time."
    )
    return ranges, "\n".join(bullet(line) for line in startup) + "\n"


def markdown(
    machine: Machine,
    results: Results,
    gs: Sequence[Goal],
    sizes: Sizes,
    runtime_s: float,
    steal: float | None,
    quick: bool,
) -> str:
    ranges, startup = notes(results, sizes)
    warning = (
        "\n> **Quick mode (`--quick`)**: smoke-test sizes; these numbers are not representative.\n"
        if quick
        else ""
    )
    dbos = results.dbos
    if dbos.error is None:
        dbos_text = (
            f"DBOS Transact {dbos.version} (PyPI `dbos`) with a SQLite system database "
            f'(`DBOS(config={{"name": …, "system_database_url": "sqlite:///…", '
            f'"log_level": "WARNING"}})`), at {dbos_durability(dbos)}: every step\'s output '
            "is committed to the system database before the workflow continues. After each run "
            f"the benchmark counted the workflow's rows in `operation_outputs`: "
            f"{', '.join(f'{p:,}' for p in dbos.persisted)} (want {sizes.steps:,}), and its "
            "status `SUCCESS`."
        )
    else:
        dbos_text = f"DBOS Transact was **not measured**: {dbos.error}."
    description = "\n".join(
        bullet(text)
        for text in (
            f"affidavit: one plan of {sizes.steps:,} nodes, each taking the previous node's output "
            '(`"prev": "${s<k-1>}"`), run by `Runtime.run_until_idle()`; the tool returns its '
            "index. A durable `tool` step writes T1 (ledger row + `node_started`, "
            "`tool_invocation_started`; `synchronous=FULL`) before the tool runs and T2 "
            "(`tool_invocation_finished`, `command_committed`, `node_finished`, ledger row "
            "committed; `synchronous=NORMAL`) after it. A `pure` step writes one "
            "`synchronous=NORMAL` transaction.",
            f"{dbos_text} The workflow calls a trivial `@DBOS.step()` {sizes.steps:,} times, "
            "each given the previous step's result.",
            "Floor: the physical minimum of our protocol, per step one synced single-row commit "
            "plus one written single-row commit (autocommit `INSERT`s of a "
            f"{len(FLOOR_PAYLOAD)}-byte row on one connection of the store's driver, `apsw`, "
            "switching `synchronous` between "
            "`FULL` and `NORMAL`) on a fresh WAL file; each synced commit also makes the previous "
            "written one durable, as T1 of the next step does for T2.",
            "In-process = the run alone (`run_until_idle()`; for DBOS the workflow call), timed "
            "inside the child. Whole-process = a fresh Python subprocess per repetition (import, "
            "open the database, build and submit the plan or launch DBOS, run, close), timed "
            "from spawn to exit. Every child uses a fresh database file; the floor runs in the "
            "benchmark process. Cases alternate their order between repetitions: "
            f"{plural(sizes.reps, 'repetition')} of the affidavit cases and the floor, "
            f"{plural(sizes.dbos_reps, 'repetition')} of DBOS.",
        )
    )
    pg_part = ""
    if results.pg:
        pg_ranges = "".join(
            bullet(f"{workers_text(r.workers)}: {spread(r.rates)}") + "\n" for r in results.pg
        )
        pg_text = textwrap.fill(
            f"{results.pg[0].jobs:,} jobs of {results.pg[0].steps_per_job} chained durable tool "
            "steps are submitted (not timed) into a fresh schema; then N worker processes (each "
            "`Worker(store, registry, lease_seconds=30).run(until_idle=True)`, already imported "
            "and connected) are released together. Steps/s = all steps ÷ (last worker's finish − "
            "first worker's start), so it includes claiming and completing the jobs. The "
            "benchmark then checks that every job completed and every ledger row is committed. "
            f"{plural(sizes.pg_reps, 'repetition')}; the order of the worker counts alternates.",
            width=100,
            break_long_words=False,
            break_on_hyphens=False,
        )
        pg_part = f"""
### PostgreSQL: many jobs, 1 vs {results.pg[-1].workers} worker processes

{pg_text}

{markdown_table(PG_HEADERS, pg_rows(results.pg), "lrrr")}
Median (min–max) of the repetitions, steps/s:

{pg_ranges}"""
    return f"""
## Steps per second vs DBOS Transact and the commit floor (`benchmarks/bench_steps.py`)
{warning}
Measured on:

{machine.markdown()}- Benchmark runtime: {runtime_s:.0f} s; {steal_text(steal)}
- SQLite files in a temporary directory on {results.filesystem}

### SQLite: one job of {sizes.steps:,} trivial chained steps

{description}

{markdown_table(SQLITE_HEADERS, sqlite_rows(results), "llrrr")}
{markdown_table(GOAL_HEADERS, goal_rows(gs), "lrll")}
Median (min–max) of the repetitions, steps/s:

{ranges}
Start-up and plan costs (medians):

{startup}
`python -m benchmarks.bench_steps --profile` prints where a tool step's time goes (cProfile of
the in-process run; the run vs the store layer alone vs the floor; CPU parts timed alone).
{pg_part}"""


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument(
        "--no-write", action="store_true", help=f"do not update {PERFORMANCE_MD.name}"
    )
    parser.add_argument("--output", type=Path, default=PERFORMANCE_MD, help="markdown file")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("AFFIDAVIT_BENCH_PG_URL", DEFAULT_PG_URL),
        help="PostgreSQL to benchmark (env AFFIDAVIT_BENCH_PG_URL); a fresh schema is used",
    )
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL cases")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the in-process SQLite tool-step run instead: print where the time goes, "
        "in µs/step; writes nothing",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.profile:
        run_profile(sizes)
        return 0
    pg_version = None if args.no_pg else pg_server_version(args.pg_url)
    machine = describe_machine(pg_version)
    for key, value in machine.rows():
        console.print(f"[dim]{key}:[/dim] {value}")
    busy = os.getloadavg()[0]
    if busy > 0.5:
        console.print(
            f"[yellow]warning: load average {busy:.2f} at start: other processes compete for "
            "CPU and disk, so the numbers will be noisy[/yellow]"
        )

    started = time.perf_counter()
    ticks = cpu_ticks()
    results = measure(sizes, args.pg_url if pg_version is not None else None)
    runtime = time.perf_counter() - started
    steal = steal_share(ticks, cpu_ticks())
    gs = goals(results)

    print_results(results, gs, sizes)
    ranges, startup = notes(results, sizes)
    console.print(ranges + startup, markup=False, highlight=False)
    console.print(f"Total benchmark runtime: {runtime:.1f} s; {steal_text(steal)}")
    if not args.no_write:
        body = markdown(machine, results, gs, sizes, runtime, steal, args.quick)
        write_section(SECTION, body, args.output)
        console.print(f"Wrote the {SECTION} section of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
