"""bench_steps on SQLite: the work, the child processes, and the cases (affidavit tool and pure
steps, DBOS Transact, the commit floor). See ``bench_steps`` for what is measured."""

from __future__ import annotations

import gc
import importlib.metadata
import json
import secrets
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
from rich.console import Console

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit import ToolRegistry, pure, tool
from affidavit.core.plan import Plan
from benchmarks._report import (
    median,
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


SIZES = Sizes(steps=2_000, reps=5, dbos_reps=5, pg_jobs=200, pg_steps=5, pg_reps=5)
QUICK_SIZES = Sizes(steps=200, reps=1, dbos_reps=1, pg_jobs=20, pg_steps=5, pg_reps=1)


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


def write_children(tmp: Path) -> dict[str, Path]:
    scripts = {"affidavit": AFFIDAVIT_CHILD, "dbos": DBOS_CHILD}
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
