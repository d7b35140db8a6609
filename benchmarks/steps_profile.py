"""``python -m benchmarks.bench_steps --profile``: where a durable tool step's time goes on
SQLite (a cProfile of the in-process run; the run vs the store layer alone vs the same SQL through
the bare driver vs the floor; CPU parts timed alone). A profiling tool: it looks inside the
runtime on purpose, and writes nothing."""

from __future__ import annotations

import cProfile
import gc
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
from rich.table import Table

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit import Runtime
from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.events import utc_now
from affidavit.core.ids import new_attempt_id, new_event_id, new_event_ids
from affidavit.core.plan import Plan, args_hash, idempotency_key
from affidavit.store import open_store
from benchmarks._report import (
    ProfileKey,
    builtin_matcher,
    function_matcher,
    median,
)
from benchmarks.steps_sqlite import (
    REGISTRY,
    TOOL_NAMES,
    Case,
    Sizes,
    chain_plan,
    console,
    run_floor,
)

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


RUNNER = "affidavit/runtime/_runner.py"
EXECUTOR = "affidavit/runtime/_step_executor.py"
PLAN = "affidavit/core/plan.py"
SQL = "affidavit/store/_sql.py"
SQL_ROWS = "affidavit/store/_sql_rows.py"
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
                function_matcher("claim", "affidavit/runtime/_worker.py"),
                function_matcher("list_events", SQL),
                function_matcher("list_events", "affidavit/store/_sql_store.py"),
                function_matcher("build_from_events", "affidavit/record/_replay.py"),
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
        lambda s: _cum_from(s, _canonical, function_matcher("encode_events", SQL_ROWS)),
    ),
    (
        "  ids: new_event_ids() (uuid7: invocation id + event ids)",
        False,
        lambda s: _cum(s, function_matcher("new_event_ids", "affidavit/core/ids.py")),
    ),
    (
        "  SQL: SELECT job + head",
        False,
        lambda s: _cum(s, function_matcher("_lock_and_head", "affidavit/store/_sqlite_tx.py")),
    ),
    (
        "  chain_events() (SHA-256 chain)",
        False,
        lambda s: _cum(s, function_matcher("chain_events", SQL_ROWS)),
    ),
    (
        "  SQL: the append's guard (job, fence, previous row)",
        False,
        lambda s: _cum_from(
            s, _sql_call, function_matcher("_append_after_head", "affidavit/store/_sqlite_tx.py")
        ),
    ),
    (
        "  SQL: INSERT events",
        False,
        lambda s: _cum(s, function_matcher("_insert_chunks", "affidavit/store/_sqlite_tx.py")),
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
            _cum_from(s, _canonical, function_matcher("run_tool", EXECUTOR))
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
                stored = tx.append(
                    job_id, encoded=t1, expected_version=version, fence=attempt, head=head
                )
            version, head = version + len(t1), bytes.fromhex(stored[-1].chain_hash)
            with store.transaction(durable=False) as tx:
                stored = tx.append(
                    job_id, encoded=t2, expected_version=version, fence=attempt, head=head
                )
                tx.ledger_finish(job_id, s.key, status="committed", result=s.result)
            version, head = version + len(t2), bytes.fromhex(stored[-1].chain_hash)
        return time.perf_counter() - start
    finally:
        store.close()


# The statements of a durable tool step on SQLite, as the store issues them (written out here:
# the benchmark replays them through the bare SQLite driver, without the store's code).
_GUARD = (
    "SELECT attempt_id, number, ? = 0 OR EXISTS "
    "(SELECT 1 FROM events WHERE seq = (number << 32) + ? AND job_id = jobs.job_id) "
    "FROM jobs WHERE job_id = ?"
)
_JOB_NUMBER = "SELECT number FROM jobs WHERE job_id = ?"


def _insert_rows(count: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * count)
    return (
        "INSERT INTO events (seq, job_id, version, event_id, type, payload, chain_hash, "
        f"recorded_at) VALUES {values}"
    )


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
    # the chain's resolved args: each step's index and the previous step's output (its index)
    resolved = [{"i": k} if k == 0 else {"i": k, "prev": k - 1} for k in range(len(plan.nodes))]
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
        ("canonical check of the resolved args", lambda: [canonical(a) for a in resolved]),
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
