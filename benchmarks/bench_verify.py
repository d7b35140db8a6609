"""Benchmark Verification Mode on one long job against the limit measured in the same run.

For each backend (SQLite in a fresh temporary file, PostgreSQL in a fresh schema dropped
afterwards) it builds one sealed, completed job of 100,000 events shaped like a real run — a
chain of 19,999 tool steps (node_started, tool_invocation_started, tool_invocation_finished,
command_committed, node_finished; one committed ledger row each) and one pure step — and
measures:

* ``verify_job``: the full verification (snapshot, streamed log, chain and stored hashes,
  execution hash, replay invariants, ledger rows against the log, seal signature);
* the limit: reading the same rows (``event_id, type, payload, chain_hash`` in version order,
  as the store reads them — SQLite: the job's range of ``seq``; PostgreSQL: its
  ``(job_id, version)`` key — SQLite by iterating a cursor of the store's driver (``apsw``),
  PostgreSQL as one query whose rows arrive 2,000 at a time, with the planner told to walk the
  key rather than sort, as the store streams them) and
  computing the bare SHA-256 chain over them, nothing else;
* memory: the ``tracemalloc`` peak of ``verify_job`` on this job and on a job a tenth its size,
  next to the peak of loading the whole log (``Store.list_events``).

Results are printed and written to this benchmark's section of ``docs/PERFORMANCE.md``.

Usage (from the repository root)::

    python benchmarks/bench_verify.py                      # both backends, writes the docs
    python benchmarks/bench_verify.py --backend sqlite --events 10000 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import secrets
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit import SigningKey
from affidavit.core.canonical import canonical_sha256
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.events import utc_now
from affidavit.core.ids import new_event_id
from affidavit.core.plan import Plan, args_hash, idempotency_key
from affidavit.record import Sealer
from affidavit.store import NewEvent, Store, connect_raw, open_store
from affidavit.verify import verify_job
from benchmarks._report import (
    cpu_ticks,
    describe_machine,
    markdown_table,
    median,
    pg_conninfo,
    pg_server_version,
    spread,
    steal_share,
    steal_text,
    write_section,
    yes_no,
)

SECTION = "bench_verify"
DEFAULT_PG_URL = "postgresql://root@127.0.0.1:5432/test"
GOAL = 0.50  # verify_job ≥ 50 % of the read + bare chain limit
FETCH = 2000
BUILD_NODES_PER_TX = 1000
# The cheapest read of a job's log in version order: PostgreSQL by its (job_id, version) key,
# SQLite as the job's range of seq (see affidavit.store.sqlite), as the store reads them.
LIMIT_SELECT = (
    "SELECT event_id, type, payload, chain_hash FROM events WHERE job_id = {p} ORDER BY version"
)
# SQLite numbers a job's events by seq = (the job's number << 32) + version: its log is a range.
_LOG_START = "(SELECT number << 32 FROM jobs WHERE job_id = ?1)"
LIMIT_SELECT_SQLITE = (
    "SELECT event_id, type, payload, chain_hash FROM events WHERE seq BETWEEN "
    f"{_LOG_START} + 1 AND {_LOG_START} + {2**32 - 1} AND job_id = ?1 ORDER BY seq"
)
# The store's session settings on PostgreSQL, and its planner setting for log reads (walk the
# primary key rather than sort: see docs/storage.md, "Long logs on PostgreSQL").
PG_READ_SETTINGS = "SET synchronous_commit = on; SET jit = off; SET enable_sort = off"

console = Console()
if not console.is_terminal:
    console = Console(width=120)


# --- the job ------------------------------------------------------------------------------------


def build_job(store: Store, events: int, sealer: Sealer) -> str:
    """A completed, sealed job of exactly ``events`` events (a multiple of 5, ≥ 10)."""
    if events % 5 or events < 10:
        raise SystemExit("--events must be a multiple of 5, at least 10")
    tools = (events - 5) // 5
    nodes: list[dict[str, Any]] = []
    for i in range(tools):
        node: dict[str, Any] = {"id": f"t{i:06d}", "type": "tool", "tool": "charge"}
        node["args"] = {"amount": i, "currency": "EUR"}
        if i:
            node["depends_on"] = [f"t{i - 1:06d}"]
        nodes.append(node)
    nodes.append(
        {
            "id": "summary",
            "type": "pure",
            "tool": "summarize",
            "args": {"last": f"${{t{tools - 1:06d}}}"},
            "depends_on": [f"t{tools - 1:06d}"],
        }
    )
    plan = Plan.parse({"name": "bench-verify", "nodes": nodes})
    at = utc_now()
    job, _ = store.create_job(
        plan_name=plan.name,
        events=[
            NewEvent(
                "job_created",
                {
                    "at": at,
                    "input": {"customer": "bench"},
                    "plan_name": plan.name,
                    "namespace": "default",
                    "submitted_by": None,
                    "idempotency_key": None,
                },
            ),
            NewEvent(
                "plan_generated",
                {
                    "at": at,
                    "task_graph": dict(plan.task_graph),
                    "plan_hash": plan.plan_hash,
                    "policy": plan.policy.to_dict(),
                },
            ),
        ],
    )
    job_id = job.job_id
    steps = plan.step_ids(job_id)
    version = 2
    for start in range(0, tools, BUILD_NODES_PER_TX):
        batch: list[NewEvent] = []
        ledger: list[tuple[str, str, str, dict[str, Any], str]] = []
        for i in range(start, min(tools, start + BUILD_NODES_PER_TX)):
            node_id = f"t{i:06d}"
            step = steps[node_id]
            args = {"amount": i, "currency": "EUR"}
            key = idempotency_key(job_id, step, "charge", args)
            invocation = new_event_id()
            result = {"charged": i, "receipt": f"affidavit:{job_id}:{step}:1"}
            base = {"at": utc_now(), "node_id": node_id, "step_id": step}
            batch += [
                NewEvent("node_started", {**base, "attempt": 1, "worker_id": "bench:1"}),
                NewEvent(
                    "tool_invocation_started",
                    {
                        **base,
                        "invocation_id": invocation,
                        "tool_name": "charge",
                        "idempotency_key": key,
                        "args_hash": args_hash(args),
                        "attempt": 1,
                    },
                ),
                NewEvent(
                    "tool_invocation_finished",
                    {
                        **base,
                        "invocation_id": invocation,
                        "idempotency_key": key,
                        "outcome": "success",
                        "result": result,
                        "catch_up": False,
                    },
                ),
                NewEvent(
                    "command_committed",
                    {
                        **base,
                        "command_id": invocation,
                        "idempotency_key": key,
                        "result_hash": canonical_sha256(result),
                    },
                ),
                NewEvent(
                    "node_finished",
                    {
                        **base,
                        "result_type": "side_effect_committed",
                        "attempt": 1,
                        "duration_ms": 1.25,
                    },
                ),
            ]
            ledger.append((node_id, step, key, result, invocation))
        with store.transaction(durable=False) as tx:
            tx.append(job_id, batch, expected_version=version)
            for node_id, step, key, result, invocation in ledger:
                tx.ledger_insert(
                    job_id=job_id,
                    key=key,
                    node_id=node_id,
                    step_id=step,
                    tool_name="charge",
                    args_hash=args_hash({"amount": int(node_id[1:]), "currency": "EUR"}),
                    invocation_id=invocation,
                    attempt_id=None,
                )
                tx.ledger_finish(job_id, key, status="committed", result=result)
        version += len(batch)
    base = {"at": utc_now(), "node_id": "summary", "step_id": steps["summary"]}
    output = {"total": tools}
    with store.transaction(durable=True) as tx:
        tx.append(
            job_id,
            [
                NewEvent("node_started", {**base, "attempt": 1, "worker_id": "bench:1"}),
                NewEvent(
                    "node_finished",
                    {**base, "result_type": "pure", "output": output, "attempt": 1},
                ),
                NewEvent("job_completed", {"at": utc_now(), "output": {"summary": output}}),
            ],
            expected_version=version,
        )
        tx.update_job(job_id, status="completed", output={"summary": output})
        sealer.seal_txn(tx, job_id)
    return job_id


# --- backends -----------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    label: str
    store: Store
    limit: Callable[[str], tuple[int, str]]  # job id -> (rows, bare chain root)
    read_only: Callable[[str], int]
    parsed: Callable[[str], tuple[int, str]]  # the limit plus parsing every payload


def _chain(rows: Iterator[Sequence[Any]]) -> tuple[int, str]:
    head = GENESIS
    n = 0
    for event_id, event_type, payload, _stored in rows:
        head = chain_next(head, event_id, event_type, bytes(payload))
        n += 1
    return n, head.hex()


def _chain_and_parse(rows: Iterator[Sequence[Any]]) -> tuple[int, str]:
    head = GENESIS
    n = 0
    for event_id, event_type, payload, _stored in rows:
        head = chain_next(head, event_id, event_type, bytes(payload))
        orjson.loads(payload)
        n += 1
    return n, head.hex()


def skeleton(store: Store, job_id: str) -> tuple[int, str]:
    """The work verification cannot skip, and no check: one snapshot, the log read as
    ``verify_job`` reads it, the chain (as the limit computes it) with every stored hash
    compared, every payload parsed, the plan read (DAG, step ids, plan hash), and the ledger
    read with every result hashed. No replay state, no comparison of the ledger with the log,
    no seal."""
    head = GENESIS
    n = 0
    with store.snapshot() as snap:
        for _version, event_id, event_type, payload, stored in snap.iter_event_rows(job_id):
            head = chain_next(head, event_id, event_type, payload)
            n += 1
            if stored != head.hex():
                raise SystemExit(f"the skeleton found event {n}'s stored hash wrong")
            parsed = orjson.loads(payload)
            if event_type == "plan_generated":
                Plan.parse(parsed["task_graph"]).step_ids(job_id)
        for row in snap.iter_ledger_columns(job_id):
            if type(row[3]) is str:  # (as verification hashes a row's result text)
                hashlib.sha256(row[3].encode()).hexdigest()
    return n, head.hex()


@contextmanager
def sqlite_target() -> Iterator[Target]:
    with tempfile.TemporaryDirectory(prefix="bench_verify_") as tmp:
        path = os.path.join(tmp, "bench.db")
        store = open_store(f"sqlite:///{path}")
        query = LIMIT_SELECT_SQLITE

        def rows(job_id: str) -> Iterator[Sequence[Any]]:
            conn = connect_raw(path)  # the store's own driver, as the store reads
            try:
                yield from conn.execute(query, (job_id,))
            finally:
                conn.close()

        try:
            yield Target(
                "sqlite",
                "SQLite",
                store,
                lambda job_id: _chain(rows(job_id)),
                lambda job_id: sum(1 for _ in rows(job_id)),
                lambda job_id: _chain_and_parse(rows(job_id)),
            )
        finally:
            store.close()


@contextmanager
def postgres_target(url: str) -> Iterator[Target]:
    conninfo = pg_conninfo(url)
    schema = f"bench_verify_{secrets.token_hex(4)}"
    sep = "&" if "?" in url else "?"
    query = LIMIT_SELECT.format(p="%s")

    def rows(job_id: str) -> Iterator[Sequence[Any]]:
        with psycopg.connect(conninfo) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            # the store's planner settings
            conn.execute(PG_READ_SETTINGS)
            yield from conn.cursor().stream(query, (job_id,), size=FETCH)  # chunked, as the store

    try:
        store = open_store(f"{url}{sep}schema={schema}")
        try:
            yield Target(
                "postgresql",
                "PostgreSQL",
                store,
                lambda job_id: _chain(rows(job_id)),
                lambda job_id: sum(1 for _ in rows(job_id)),
                lambda job_id: _chain_and_parse(rows(job_id)),
            )
        finally:
            store.close()
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# --- measurements -------------------------------------------------------------------------------


@dataclass
class Result:
    label: str
    events: int
    build_s: float
    verify_s: list[float]
    limit_s: list[float]
    read_s: list[float]
    parsed_s: list[float]
    skeleton_s: list[float]  # see skeleton()
    plan_s: float  # reading the job's plan once, as verify_job does
    peak_verify: int  # bytes, this job
    peak_verify_small: int  # bytes, the job a tenth the size
    small_events: int
    peak_load: int  # bytes, list_events of this job

    @property
    def verify_rate(self) -> float:
        return self.events / median(self.verify_s)

    @property
    def limit_rate(self) -> float:
        return self.events / median(self.limit_s)

    @property
    def ratio(self) -> float:
        return self.verify_rate / self.limit_rate

    @property
    def skeleton_ratio(self) -> float:
        return median(self.limit_s) / median(self.skeleton_s)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def peak_of(fn: Callable[[], Any]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run_backend(target: Target, events: int, reps: int) -> Result:
    sealer = Sealer(key=SigningKey.generate())
    console.print(f"[bold]{target.label}[/]: building a job of {events:,} events …")
    build_s, job_id = timed(lambda: build_job(target.store, events, sealer))
    small_events = max(10, events // 10 // 5 * 5)
    small_id = build_job(target.store, small_events, sealer)
    first = verify_job(target.store, job_id)
    if not first.ok or first.stored_chain.event_count != events:
        raise SystemExit(f"the benchmark job does not verify: {first.checks()}")
    n, root = target.limit(job_id)
    if (n, root) != (events, first.event_chain_root_hash):
        raise SystemExit("the limit read different rows than verify_job")
    verify_s: list[float] = []
    limit_s: list[float] = []
    read_s: list[float] = []
    parsed_s: list[float] = []
    skeleton_s: list[float] = []
    plan_payload = target.store.list_events(job_id, limit=2)[1].payload_bytes

    def read_the_plan() -> None:
        p = orjson.loads(plan_payload)
        Plan.parse(p["task_graph"]).step_ids(job_id)

    plan_s = min(timed(read_the_plan)[0] for _ in range(3))
    for rep in range(reps):
        order = ("verify", "limit") if rep % 2 == 0 else ("limit", "verify")
        for which in order:
            if which == "verify":
                verify_s.append(timed(lambda: verify_job(target.store, job_id))[0])
            else:
                limit_s.append(timed(lambda: target.limit(job_id))[0])
        read_s.append(timed(lambda: target.read_only(job_id))[0])
        parsed_s.append(timed(lambda: target.parsed(job_id))[0])
        skeleton_s.append(timed(lambda: skeleton(target.store, job_id))[0])
        console.print(
            f"  rep {rep + 1}: verify {verify_s[-1]:.2f} s, limit {limit_s[-1]:.2f} s "
            f"({limit_s[-1] / verify_s[-1]:.0%} of the limit in this pair), "
            f"read only {read_s[-1]:.2f} s, limit + JSON parse {parsed_s[-1]:.2f} s, "
            f"skeleton {skeleton_s[-1]:.2f} s"
        )
    return Result(
        label=target.label,
        events=events,
        build_s=build_s,
        verify_s=verify_s,
        limit_s=limit_s,
        read_s=read_s,
        parsed_s=parsed_s,
        skeleton_s=skeleton_s,
        plan_s=plan_s,
        peak_verify=peak_of(lambda: verify_job(target.store, job_id)),
        peak_verify_small=peak_of(lambda: verify_job(target.store, small_id)),
        small_events=small_events,
        peak_load=peak_of(lambda: target.store.list_events(job_id)),
    )


# --- report -------------------------------------------------------------------------------------


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def speed_rows(results: Sequence[Result]) -> list[list[str]]:
    return [
        [
            r.label,
            f"{r.events:,}",
            f"{median(r.verify_s):.2f} s",
            f"{r.verify_rate:,.0f}",
            f"{r.limit_rate:,.0f}",
            f"{r.ratio:.0%}",
            f"{r.skeleton_ratio:.0%}",
            f"≥ {GOAL:.0%} of the limit",
            yes_no(r.ratio >= GOAL),
        ]
        for r in results
    ]


SPEED_HEADERS = [
    "Backend",
    "Events",
    "verify_job",
    "Verified events/s",
    "Limit events/s",
    "Verify / limit",
    "Skeleton / limit",
    "Goal",
    "Met?",
]
MEMORY_HEADERS = [
    "Backend",
    "verify_job peak, small job",
    "verify_job peak, this job",
    "Loading the log (list_events)",
    "verify_job bytes/event",
    "list_events bytes/event",
]


def memory_rows(results: Sequence[Result]) -> list[list[str]]:
    return [
        [
            r.label,
            f"{mib(r.peak_verify_small)} ({r.small_events:,} events)",
            f"{mib(r.peak_verify)} ({r.events:,} events)",
            mib(r.peak_load),
            f"{r.peak_verify / r.events:,.0f}",
            f"{r.peak_load / r.events:,.0f}",
        ]
        for r in results
    ]


def print_results(results: Sequence[Result]) -> None:
    for headers, rows in (
        (SPEED_HEADERS, speed_rows(results)),
        (MEMORY_HEADERS, memory_rows(results)),
    ):
        table = Table(*headers)
        for row in rows:
            table.add_row(*row)
        console.print(table)


def markdown(results: Sequence[Result], machine: str, seconds: float, steal: str, reps: int) -> str:
    detail = "\n".join(
        f"- {r.label}: verify {spread([r.events / s for s in r.verify_s])} events/s; limit "
        f"{spread([r.events / s for s in r.limit_s])}; reading the rows alone "
        f"{spread([r.events / s for s in r.read_s])}; the limit plus parsing every payload "
        f"(`orjson.loads`) {spread([r.events / s for s in r.parsed_s])}; reading the job's plan "
        f"once as `verify_job` does (parsing the `plan_generated` payload, deriving the DAG and "
        f"the step ids of {(r.events - 5) // 5 + 1:,} nodes) {r.plan_s:.2f} s = "
        f"{r.plan_s / median(r.verify_s):.0%} of `verify_job`; the skeleton "
        f"{spread([r.events / s for s in r.skeleton_s])}; building the job took "
        f"{r.build_s:.0f} s"
        for r in results
    )
    return f"""## Verification Mode (`benchmarks/bench_verify.py`)

Measured on:

{machine}- Benchmark runtime: {seconds:.0f} s; {steal}

The job: one completed, sealed job shaped like a real run — a chain of tool steps (each:
`node_started`, `tool_invocation_started`, `tool_invocation_finished` with a small result,
`command_committed`, `node_finished`, and one committed ledger row), one pure step and
`job_completed`. `verify_job` = everything `affidavit verify` does: one read snapshot, the log
streamed, every stored chain hash recomputed, the execution hash, every replay invariant,
every ledger row against the log, the seal's Ed25519 signature. The limit, measured in the
same run on the same rows = a plain cursor of the store's driver reading `event_id, type,
payload, chain_hash` in version order as the store reads them (SQLite: the job's range of
`seq`, iterating an `apsw` cursor; PostgreSQL: its `(job_id, version)` key, one psycopg query
whose rows arrive in chunks of 2,000, the planner told to walk the key rather than sort, as the
store tells it) and computing the bare SHA-256 chain, nothing else. The tables are not analyzed
after the job is written (as right after a run, and as for any long job among many short ones).
Median of {reps} repetitions, verify and limit alternating which goes first.

"Skeleton / limit": the work verification cannot skip, with no check of any kind, against the
same limit — one snapshot, the log read as `verify_job` reads it, the chain (computed as the
limit computes it) with every stored hash compared, every payload parsed, the plan read (its
DAG, step ids and plan hash), the ledger read and every result hashed; no replay state, no
comparison of the ledger with the log, no seal. It is how far verification could go were its
checks free.

{markdown_table(SPEED_HEADERS, speed_rows(results), "lrrrrrrll")}
Median (min–max), events/s:

{detail}

Memory (`tracemalloc` peak of Python allocations during the call):

{markdown_table(MEMORY_HEADERS, memory_rows(results), "lrrrrr")}
The log is streamed, never held: what the checks keep is the plan reduced to node types,
dependencies and step ids, and one entry per idempotency key and per node (committed keys with
their result hash, completed nodes). The peak comes from parsing the
`plan_generated` payload itself (a task graph of one node per tool step; `orjson` peaks at about
2.8 times the parsed size while building it). Both grow with the number of steps in the plan,
not with the number or size of event payloads.
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--events", type=int, default=100_000, help="events in the job (default 100000)")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    p.add_argument("--pg-url", default=os.environ.get("AFFIDAVIT_BENCH_PG_URL", DEFAULT_PG_URL))
    p.add_argument("--no-write", action="store_true", help="do not update docs/PERFORMANCE.md")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    pg_version = pg_server_version(args.pg_url) if "postgresql" in backends else None
    machine = describe_machine(pg_version)
    start, ticks = time.perf_counter(), cpu_ticks()
    results = []
    for name in backends:
        target = sqlite_target() if name == "sqlite" else postgres_target(args.pg_url)
        with target as t:
            results.append(run_backend(t, args.events, args.reps))
    seconds = time.perf_counter() - start
    steal = steal_text(steal_share(ticks, cpu_ticks()))
    print_results(results)
    if not args.no_write:
        write_section(SECTION, markdown(results, machine.markdown(), seconds, steal, args.reps))
        console.print("wrote docs/PERFORMANCE.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
