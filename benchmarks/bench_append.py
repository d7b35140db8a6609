"""Benchmark the event store's chained append against the raw insert limit of its database.

For each backend (SQLite in a fresh temporary file, PostgreSQL in a fresh schema that is dropped
afterwards) it measures, in events per second:

* chained append (``Store.append``: canonicalize, hash-chain from the job's head, insert, move
  the head), one event per durable transaction and 100 events per durable transaction;
* the raw limit for the same two shapes: plain INSERTs of pre-built rows into the store's own
  ``events`` table (no canonicalization, no hashing, no head read or update), with the same
  durability (SQLite ``synchronous=FULL`` in WAL mode, PostgreSQL ``synchronous_commit=on``);
* the per-event cost of 100-event durable appends to a job whose log already holds ~1k events
  versus one that holds ~100k events.

Results are printed and written to this benchmark's section of ``docs/PERFORMANCE.md``.

Usage (from the repository root)::

    python -m benchmarks.bench_append                 # both backends, writes docs/PERFORMANCE.md
    python -m benchmarks.bench_append --backend sqlite --quick --no-write   # smoke test
    python -m benchmarks.bench_append --profile           # where the time goes (writes nothing)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import apsw
import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.events import utc_now
from affidavit.core.ids import new_event_id, new_event_ids
from affidavit.store import NewEvent, Store, StoredEvent, open_store
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
    pg_server_version,
    plural,
    spread,
    steal_share,
    steal_text,
    write_section,
    yes_no,
)

SECTION = "bench_append"
DEFAULT_PG_URL = "postgresql://root@127.0.0.1:5432/test"
BATCH = 100
BUILD_BATCH = 1000  # events per (non-durable) transaction when pre-building long logs

GOAL_BATCHED = 0.50  # chained ≥ 50 % of raw, 100 events per transaction
GOAL_SINGLE = 0.70  # chained ≥ 70 % of raw, one event per transaction
GOAL_GROWTH = 1.20  # µs/event at the long log ≤ 1.2 × µs/event at the short log

RAW_INSERT = (
    "INSERT INTO events (job_id, version, event_id, type, payload, chain_hash) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, {p})"
)
RAW_INSERT_SQLITE = (
    "INSERT INTO events (seq, job_id, version, event_id, type, payload, chain_hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
DUMMY_HASH = "0" * 64
EVENT_TYPES = ("node_started", "tool_called", "node_finished")

# An events row as the raw writers insert it: (job_id, version, event_id, type, payload, hash).
Row = tuple[str, int, str, str, bytes, str]

console = Console()
if not console.is_terminal:  # piped or captured: don't wrap the tables at 80 columns
    console = Console(width=120)


# --- configuration --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each case does on one backend."""

    single: int  # events appended one per durable transaction, per repetition
    single_reps: int  # repetitions (the median is reported)
    batched: int  # events appended 100 per durable transaction, per repetition
    batched_reps: int
    short_log: int  # events already in the "short" job's log
    long_log: int  # events already in the "long" job's log
    growth: int  # events appended (100 per transaction) to each job, per repetition
    growth_reps: int


SIZE_LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
SIZES: dict[str, Sizes] = {
    "sqlite": Sizes(500, 5, 20_000, 3, 1_000, 100_000, 1_000, 7),
    "postgresql": Sizes(500, 5, 20_000, 3, 1_000, 100_000, 1_000, 7),
}
QUICK_SIZES: dict[str, Sizes] = {
    "sqlite": Sizes(50, 1, 1_000, 1, 100, 2_000, 200, 1),
    "postgresql": Sizes(50, 1, 1_000, 1, 100, 2_000, 200, 1),
}


# --- payloads -------------------------------------------------------------------------------

_VOCABULARY = (
    "agent tool call result retry lease token budget plan node edge claim seal verify "
    "receipt ledger invoice customer refund shipment address postal order total currency "
    "approve reject pending review summary context window prompt response latency error "
    "timeout backoff jitter idempotent replay chain digest signature witness anchor proof "
    "policy quota region tenant account session cursor offset batch stream commit durable"
)
_WORDS = tuple(_VOCABULARY.split())
_TOOLS = ("http.get", "http.post", "sql.query", "email.send", "llm.complete", "fs.write")
_MODELS = ("small-2025-01", "medium-2025-03", "large-2025-06")
_STATUSES = ("ok", "ok", "ok", "retry", "error")


class PayloadSource:
    """Deterministic, distinct ~1 KB JSON payloads (11 fields, one 800-character text)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._seq = 0

    def payload(self) -> dict[str, Any]:
        rng = self._rng
        self._seq += 1
        text = " ".join(rng.choices(_WORDS, k=150))[:800]
        return {
            "node_id": f"node-{rng.randrange(1000):03d}",
            "seq": self._seq,
            "attempt": rng.randint(1, 3),
            "tool": rng.choice(_TOOLS),
            "model": rng.choice(_MODELS),
            "status": rng.choice(_STATUSES),
            "trace_id": f"{rng.getrandbits(128):032x}",
            "tokens_in": rng.randint(100, 20_000),
            "tokens_out": rng.randint(10, 4_000),
            "latency_ms": rng.randint(5, 30_000),
            "text": text,
        }

    def events(self, n: int) -> list[NewEvent]:
        return [NewEvent(EVENT_TYPES[i % 3], self.payload()) for i in range(n)]

    def raw_rows(self, job_id: str, n: int, after: int = 0) -> list[Row]:
        """Rows ready to INSERT: versions after+1..after+n, fresh time-ordered event ids (as
        the store makes them), canonical payload bytes, a constant dummy hash."""
        return [
            (job_id, v, new_event_id(), EVENT_TYPES[v % 3], canonical(self.payload()), DUMMY_HASH)
            for v in range(after + 1, after + n + 1)
        ]


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# --- backends -------------------------------------------------------------------------------


class RawWriter(Protocol):
    """Plain INSERTs into the store's ``events`` table, one transaction per chunk."""

    def insert(self, batches: Sequence[Sequence[Row]]) -> float:
        """Insert each batch in its own durable transaction; return elapsed seconds."""
        ...

    def settle(self) -> None:
        """Checkpoint the database so that no case starts with another's backlog."""
        ...

    def close(self) -> None: ...


class SqliteRaw:
    """The store's rows as SQLite keeps them: each raw job's log is a range of seq too (see
    affidavit.store.sqlite), numbered far above the store's jobs."""

    def __init__(self, path: str) -> None:
        # the store's own SQLite driver (two copies of SQLite must not open one file in one
        # process: see affidavit.store.sqlite.RawConnection)
        self._conn = apsw.Connection(path)
        self._conn.set_busy_timeout(30_000)
        self._conn.execute("PRAGMA journal_mode=WAL").fetchall()
        self._conn.execute("PRAGMA synchronous=FULL")
        self._sql = RAW_INSERT_SQLITE
        self._bases: dict[str, int] = {}

    def _with_seq(self, batch: Sequence[Row]) -> list[tuple[Any, ...]]:
        bases = self._bases
        return [(bases.setdefault(r[0], (2**30 + len(bases)) << 32) + r[1], *r) for r in batch]

    def insert(self, batches: Sequence[Sequence[Row]]) -> float:
        conn, stmt = self._conn, self._sql
        rows = [self._with_seq(batch) for batch in batches]  # made before timing, as the rest
        gc.collect()
        start = time.perf_counter()
        for batch in rows:
            if len(batch) == 1:  # the cheapest single-row commit: an autocommit INSERT
                conn.execute(stmt, batch[0])
                continue
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(stmt, batch)
            conn.execute("COMMIT")
        return time.perf_counter() - start

    def settle(self) -> None:
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def close(self) -> None:
        self._conn.close()


class PostgresRaw:
    def __init__(self, conninfo: str, schema: str) -> None:
        self._conn = psycopg.connect(conninfo, autocommit=True)
        self._conn.execute("SET synchronous_commit = on")
        self._conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        self._sql = RAW_INSERT.format(p="%s")

    def insert(self, batches: Sequence[Sequence[Row]]) -> float:
        conn, stmt = self._conn, self._sql
        cur = conn.cursor()
        gc.collect()
        start = time.perf_counter()
        for batch in batches:
            if len(batch) == 1:  # the cheapest single-row commit: one autocommit INSERT
                cur.execute(stmt, batch[0])
                continue
            with conn.transaction():
                cur.executemany(stmt, batch)
        return time.perf_counter() - start

    def settle(self) -> None:
        with suppress(psycopg.errors.InsufficientPrivilege):  # needs superuser or pg_checkpoint
            self._conn.execute("CHECKPOINT")

    def close(self) -> None:
        self._conn.close()


@dataclass
class Target:
    """One backend under test: the store and a raw writer on the same database."""

    name: str
    label: str
    store: Store
    raw: RawWriter

    def settle(self) -> None:
        self.raw.settle()


@contextmanager
def sqlite_target() -> Iterator[Target]:
    with tempfile.TemporaryDirectory(prefix="bench_append_") as tmp:
        path = os.path.join(tmp, "bench.db")
        store = open_store(f"sqlite:///{path}")
        raw = SqliteRaw(path)
        try:
            yield Target("sqlite", "SQLite", store, raw)
        finally:
            raw.close()
            store.close()


@contextmanager
def postgres_target(url: str) -> Iterator[Target]:
    conninfo = pg_conninfo(url)
    schema = f"bench_append_{secrets.token_hex(4)}"
    sep = "&" if "?" in url else "?"
    try:
        store = open_store(f"{url}{sep}schema={schema}")
        raw = PostgresRaw(conninfo, schema)
        try:
            yield Target("postgresql", "PostgreSQL", store, raw)
        finally:
            raw.close()
            store.close()
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# --- measurements ---------------------------------------------------------------------------


class ChainedJob:
    """A job whose version the benchmark tracks, so every append passes the right one."""

    def __init__(self, store: Store, plan_name: str) -> None:
        self.store = store
        job, _ = store.create_job(plan_name=plan_name)
        self.job_id = job.job_id
        self.version = job.version

    def append(self, events: Sequence[NewEvent], *, durable: bool) -> list[StoredEvent]:
        stored = self.store.append(
            self.job_id, events, expected_version=self.version, durable=durable
        )
        self.version = stored[-1].version
        return stored

    def fill(self, events: Sequence[NewEvent]) -> None:
        """Pre-build the log with large non-durable transactions (not measured)."""
        for batch in chunks(events, BUILD_BATCH):
            self.append(batch, durable=False)

    def timed(self, batches: Sequence[Sequence[NewEvent]]) -> float:
        """Append each batch in its own durable transaction; return elapsed seconds."""
        gc.collect()
        start = time.perf_counter()
        for batch in batches:
            self.append(batch, durable=True)
        return time.perf_counter() - start


@dataclass(frozen=True, slots=True)
class Throughput:
    backend: str
    shape: str  # "1 event/tx" or "100 events/tx"
    chained_runs: tuple[float, ...]  # events/s of each repetition
    raw_runs: tuple[float, ...]
    goal: float  # minimum chained/raw

    @property
    def chained(self) -> float:
        return median(self.chained_runs)

    @property
    def raw(self) -> float:
        return median(self.raw_runs)

    @property
    def ratio(self) -> float:
        return self.chained / self.raw

    @property
    def met(self) -> bool:
        return self.ratio >= self.goal


@dataclass(frozen=True, slots=True)
class Growth:
    backend: str
    short_log: int
    long_log: int
    short_runs: tuple[float, ...]  # µs/event of each repetition
    long_runs: tuple[float, ...]

    @property
    def short_us(self) -> float:
        return median(self.short_runs)

    @property
    def long_us(self) -> float:
        return median(self.long_runs)

    @property
    def ratio(self) -> float:
        return self.long_us / self.short_us

    @property
    def met(self) -> bool:
        return self.ratio <= GOAL_GROWTH


def measure_throughput(
    target: Target, source: PayloadSource, events: int, batch: int, reps: int, goal: float
) -> Throughput:
    """Chained vs raw for one transaction shape; repetitions alternate which goes first."""
    job = ChainedJob(target.store, f"bench-{batch}")
    raw_job = f"raw-{batch}-{secrets.token_hex(6)}"
    raw_version = 0

    def raw_rows(n: int) -> list[Row]:
        nonlocal raw_version
        rows = source.raw_rows(raw_job, n, after=raw_version)
        raw_version += n
        return rows

    warm = max(batch * 2, 20)  # connections, statement caches, first pages
    job.timed(chunks(source.events(warm), batch))
    target.raw.insert(chunks(raw_rows(warm), batch))

    chained: list[float] = []
    raw: list[float] = []
    for rep in range(reps):
        ev_batches = chunks(source.events(events), batch)
        row_batches = chunks(raw_rows(events), batch)
        chained_first = rep % 2 == 0
        if not chained_first:
            raw.append(events / target.raw.insert(row_batches))
        chained.append(events / job.timed(ev_batches))
        if chained_first:
            raw.append(events / target.raw.insert(row_batches))
    shape = "1 event/tx" if batch == 1 else f"{batch} events/tx"
    result = Throughput(target.label, shape, tuple(chained), tuple(raw), goal)
    console.print(
        f"    chained {spread(result.chained_runs)}; raw {spread(result.raw_runs)} events/s"
    )
    return result


def measure_growth(target: Target, source: PayloadSource, sizes: Sizes) -> Growth:
    """µs/event of 100-event durable appends at a short and at a long log.

    The long log is built first; then each repetition makes a fresh short job and appends the
    same number of events to both, alternating which goes first. Both are therefore measured
    on the same (large) table, so the ratio isolates the dependence on the job's own log.
    """
    long_job = ChainedJob(target.store, "bench-long")
    long_job.fill(source.events(sizes.long_log))
    target.settle()
    short_us: list[float] = []
    long_us: list[float] = []
    for rep in range(sizes.growth_reps):
        short_job = ChainedJob(target.store, "bench-short")
        short_job.fill(source.events(sizes.short_log))
        pairs = [(short_job, short_us), (long_job, long_us)]
        for job, out in pairs if rep % 2 == 0 else reversed(pairs):
            batches = chunks(source.events(sizes.growth), BATCH)
            out.append(job.timed(batches) / sizes.growth * 1e6)
    result = Growth(target.label, sizes.short_log, sizes.long_log, tuple(short_us), tuple(long_us))
    console.print(
        f"    at {sizes.short_log:,}: {spread(result.short_runs, '.1f')}; "
        f"at {sizes.long_log:,}: {spread(result.long_runs, '.1f')} µs/event"
    )
    return result


def run_backend(target: Target, sizes: Sizes, seed: int) -> tuple[list[Throughput], Growth]:
    source = PayloadSource(seed)
    results = []
    for events, reps, batch, goal in (
        (sizes.single, sizes.single_reps, 1, GOAL_SINGLE),
        (sizes.batched, sizes.batched_reps, BATCH, GOAL_BATCHED),
    ):
        console.print(f"  {target.label}: {events:,} events × {reps}, {batch} per transaction")
        target.settle()
        results.append(measure_throughput(target, source, events, batch, reps, goal))
    console.print(
        f"  {target.label}: append cost at {sizes.short_log} vs {sizes.long_log} events "
        f"(building the long log)"
    )
    growth = measure_growth(target, source, sizes)
    return results, growth


# --- profile --------------------------------------------------------------------------------


# (label, top-level?, predicate): cumulative time summed over matching functions. Indented
# labels are parts of the row above them. Rows that match nothing on a backend are not shown.
_PROFILE_PARTS: list[tuple[str, bool, Callable[[ProfileKey], bool]]] = [
    ("encode_events() (validate, id, canonicalize)", True, function_matcher("encode_events")),
    ("  canonical() JSON", False, function_matcher("canonical", "canonical.py")),
    ("  new_event_id()", False, function_matcher("new_event_id")),
    ("chain_next() (SHA-256 over base64 payload)", True, function_matcher("chain_next")),
    ("  base64 encode", False, builtin_matcher("b2a_base64")),
    ("  sha256", False, builtin_matcher("openssl_sha256")),
    ("StoredEvent(...) construction", True, lambda k: k[0] == "<string>" and k[2] == "__init__"),
    ("digest.hex()", True, builtin_matcher("method 'hex' of 'bytes'")),
    ("utc_now()", True, function_matcher("utc_now")),
    (
        "SQL: BEGIN IMMEDIATE + COMMIT (fsync)",
        True,
        builtin_matcher("'execute' of 'apsw.Connection'"),
    ),
    ("SQL: SELECT head + UPDATE head", True, builtin_matcher("'execute' of 'apsw.Cursor'")),
    (
        "SQL: INSERT events (executemany)",
        True,
        builtin_matcher("'executemany' of 'apsw.Cursor'"),
    ),
    ("SQL: pool getconn + putconn", True, lambda k: k[2] in ("getconn", "putconn")),
    (
        "SQL: BEGIN (transaction enter)",
        True,
        function_matcher("__enter__", "psycopg/transaction.py"),
    ),
    (
        "SQL: COMMIT (fsync; transaction exit)",
        True,
        function_matcher("__exit__", "psycopg/transaction.py"),
    ),
    (
        "SQL: SELECT … FOR UPDATE + UPDATE head",
        True,
        function_matcher("execute", "psycopg/cursor.py"),
    ),
    (
        "SQL: INSERT events (executemany)",
        True,
        function_matcher("executemany", "psycopg/cursor.py"),
    ),
]


def profile_backend(target: Target, source: PayloadSource, events: int, batch: int) -> None:
    """Where a durable chained append spends its time on one backend, in µs/event."""
    job = ChainedJob(target.store, "bench-profile")
    job.timed(chunks(source.events(2 * batch), batch))  # warm up
    plain = job.timed(chunks(source.events(events), batch))
    batches = chunks(source.events(events), batch)
    profiler = cProfile.Profile()
    gc.collect()
    profiler.enable()
    profiled = job.timed(batches)
    profiler.disable()
    raw = target.raw.insert(chunks(source.raw_rows(f"raw-profile-{batch}", events), batch))

    # {(file, line, function): (cc, nc, tottime, cumtime, callers)}; not in typeshed
    profile_stats = pstats.Stats(profiler)
    stats: dict[ProfileKey, tuple[Any, ...]] = profile_stats.stats  # type: ignore[attr-defined]
    shape = "1 event/tx" if batch == 1 else f"{batch} events/tx"
    table = Table(title=f"cProfile: {target.label} chained append, {shape}, {events:,} events")
    table.add_column("part")
    table.add_column("µs/event", justify="right")
    table.add_column("share", justify="right")
    table.add_row("total under cProfile", f"{profiled / events * 1e6:.1f}", "100%")
    accounted = 0.0
    for label, top, match in _PROFILE_PARTS:
        cum = sum(v[3] for k, v in stats.items() if match(k))
        if cum == 0:
            continue
        accounted += cum if top else 0.0
        table.add_row(label, f"{cum / events * 1e6:.1f}", f"{cum / profiled:.0%}")
    rest = profiled - accounted
    table.add_row("other (Python glue, profiler overhead)", f"{rest / events * 1e6:.1f}", "")
    console.print(table)
    console.print(
        f"Without the profiler: chained {plain / events * 1e6:.1f} µs/event, raw insert "
        f"{raw / events * 1e6:.1f} µs/event (same shape, same database).\n"
    )


def run_profile(backends: Sequence[str], sizes: dict[str, Sizes], pg_url: str, seed: int) -> None:
    source = PayloadSource(seed)
    for name in backends:
        target_cm = sqlite_target() if name == "sqlite" else postgres_target(pg_url)
        with target_cm as target:
            for events, batch in ((sizes[name].single, 1), (sizes[name].batched, BATCH)):
                target.settle()
                profile_backend(target, source, events, batch)
    micro_costs(source, sizes["sqlite"].batched)


def micro_costs(source: PayloadSource, n: int) -> None:
    """The CPU parts of an append timed alone, without the profiler's per-call overhead."""
    payloads = [source.payload() for _ in range(n)]
    events = [NewEvent("node_started", p) for p in payloads]

    def per_event(fn: Callable[[], object]) -> float:
        gc.collect()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) / n * 1e6

    ids = new_event_ids(n)
    blobs = [canonical(p) for p in payloads]

    def chain() -> None:
        prev = GENESIS
        for i in range(n):
            prev = chain_next(prev, ids[i], "node_started", blobs[i])

    def stored() -> None:
        for i in range(n):
            StoredEvent("j", i, ids[i], "node_started", blobs[i], DUMMY_HASH)

    parts: list[tuple[str, Callable[[], object]]] = [
        (
            "encoding (ids + canonical, as the store encodes)",
            lambda: (new_event_ids(n), [canonical(e.payload) for e in events]),
        ),
        ("  canonical()", lambda: [canonical(p) for p in payloads]),
        ("  new_event_id()", lambda: [new_event_id() for _ in range(n)]),
        ("chain_next()", chain),
        ("digest.hex()", lambda: [b.hex() for b in [bytes(32)] * n]),
        ("StoredEvent(...)", stored),
        ("utc_now() (once per tx; shown per call)", lambda: [utc_now() for _ in range(n)]),
    ]
    table = Table(title=f"CPU parts of an append, timed alone ({n} events)")
    table.add_column("part")
    table.add_column("µs/event", justify="right")
    for label, fn in parts:
        table.add_row(label, f"{per_event(fn):.2f}")
    console.print(table)


# --- report ---------------------------------------------------------------------------------


def throughput_rows(results: Sequence[Throughput]) -> list[list[str]]:
    return [
        [
            r.backend,
            r.shape,
            fmt_rate(r.chained),
            fmt_rate(r.raw),
            f"{r.ratio:.0%}",
            f"≥ {r.goal:.0%} of raw",
            yes_no(r.met),
        ]
        for r in results
    ]


def growth_rows(results: Sequence[Growth]) -> list[list[str]]:
    return [
        [
            g.backend,
            f"{g.short_us:.1f}",
            f"{g.long_us:.1f}",
            f"{g.ratio:.2f}",
            f"≤ {GOAL_GROWTH:.1f}",
            yes_no(g.met),
        ]
        for g in results
    ]


THROUGHPUT_HEADERS = [
    "Backend",
    "Shape",
    "Chained events/s",
    "Raw events/s",
    "Chained / raw",
    "Goal",
    "Met?",
]


def growth_headers(results: Sequence[Growth]) -> list[str]:
    short = {g.short_log for g in results}
    long_ = {g.long_log for g in results}
    s = f"~{min(short):,}" if len(short) == 1 else "short"
    m = f"~{min(long_):,}" if len(long_) == 1 else "long"
    return [
        "Backend",
        f"µs/event at {s} events",
        f"µs/event at {m} events",
        "Ratio",
        "Goal",
        "Met?",
    ]


def print_results(throughput: Sequence[Throughput], growth: Sequence[Growth]) -> None:
    table = Table(title="Chained append vs raw insert (durable commits, median)")
    for h in THROUGHPUT_HEADERS:
        table.add_column(h, justify="left" if h in ("Backend", "Shape", "Goal") else "right")
    for row in throughput_rows(throughput):
        table.add_row(*[c.replace("**", "") for c in row])
    console.print(table)
    table = Table(title="Append cost vs log length (100 events/tx, durable, median)")
    for h in growth_headers(growth):
        table.add_column(h, justify="left" if h in ("Backend", "Goal") else "right")
    for row in growth_rows(growth):
        table.add_row(*[c.replace("**", "") for c in row])
    console.print(table)


def markdown(
    machine: Machine,
    throughput: Sequence[Throughput],
    growth: Sequence[Growth],
    sizes: dict[str, Sizes],
    runtime_s: float,
    steal: float | None,
    quick: bool,
) -> str:
    counts = "".join(
        f"- {SIZE_LABELS[name]}: {s.single:,} events at 1 event/tx "
        f"({plural(s.single_reps, 'repetition')}) and {s.batched:,} events at {BATCH} events/tx "
        f"({plural(s.batched_reps, 'repetition')})\n"
        for name, s in sizes.items()
    )
    growth_note = "".join(
        f"- {SIZE_LABELS[name]}: {s.growth:,} events appended to each job per repetition; "
        f"{plural(s.growth_reps, 'repetition')}\n"
        for name, s in sizes.items()
    )
    throughput_ranges = "".join(
        f"- {r.backend}, {r.shape}: chained {spread(r.chained_runs)}; raw {spread(r.raw_runs)}\n"
        for r in throughput
    )
    growth_ranges = "".join(
        f"- {g.backend}: at ~{g.short_log:,} events {spread(g.short_runs, '.1f')}; "
        f"at ~{g.long_log:,} events {spread(g.long_runs, '.1f')}\n"
        for g in growth
    )
    warning = (
        "\n> **Quick mode (`--quick`)**: smoke-test sizes; these numbers are not representative.\n"
        if quick
        else ""
    )
    return f"""
## Chained event append (`benchmarks/bench_append.py`)
{warning}
Measured on:

{machine.markdown()}- Benchmark runtime: {runtime_s:.0f} s; {steal_text(steal)}

Chained = `Store.append` (canonicalize each payload once, lock the job, read its head, check
fence and version, hash-chain the events from the head, insert them; one transaction). Raw =
plain INSERTs of pre-built rows (payload bytes already encoded, dummy hash, no lock, no head
read; on SQLite each row with its `seq`, as the store writes it) into the store's own `events`
table, same database, same durability — SQLite
`journal_mode=WAL`, `synchronous=FULL`; PostgreSQL `synchronous_commit=on` — in the cheapest
plain form: one autocommit INSERT per single-row commit, `BEGIN`…`executemany`…`COMMIT` for
100 rows, through the store's own driver (SQLite: `apsw`; PostgreSQL: psycopg). Payloads are
distinct, deterministic ~1 KB JSON objects (11 fields, one 800-character text). SQLite runs on a
fresh file in a temporary directory, PostgreSQL in a fresh schema. Each case is warmed up and
starts after a checkpoint (SQLite `wal_checkpoint(TRUNCATE)`,
PostgreSQL `CHECKPOINT`); chained and raw repetitions alternate which goes first.

{counts}
{markdown_table(THROUGHPUT_HEADERS, throughput_rows(throughput), "llrrrll")}
Median (min–max) of the repetitions, events/s:

{throughput_ranges}
### Append cost vs log length

Per-event cost of durable 100-event appends to a job whose log already holds the given number of
events. The long log is pre-built with batched `durable=False` appends (1,000 events per
transaction) and checkpointed; each repetition then appends to a fresh short job and to the
long job, so both are measured on the same table and the ratio isolates the job's own log
length.

{growth_note}
{markdown_table(growth_headers(growth), growth_rows(growth), "lrrrll")}
Median (min–max) of the repetitions, µs/event:

{growth_ranges}"""


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "all"), default="all")
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
    parser.add_argument("--seed", type=int, default=20260522)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the chained append (both shapes) instead: print where time goes, "
        "in µs/event; writes nothing",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    table = QUICK_SIZES if args.quick else SIZES
    backends = ["sqlite", "postgresql"] if args.backend == "all" else [args.backend]
    pg_version = pg_server_version(args.pg_url) if "postgresql" in backends else None
    if args.profile:
        run_profile(backends, table, args.pg_url, args.seed)
        return 0
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
    throughput: list[Throughput] = []
    growth: list[Growth] = []
    for name in backends:
        target_cm = sqlite_target() if name == "sqlite" else postgres_target(args.pg_url)
        with target_cm as target:
            results, g = run_backend(target, table[name], args.seed)
        throughput.extend(results)
        growth.append(g)
    runtime = time.perf_counter() - started
    steal = steal_share(ticks, cpu_ticks())

    print_results(throughput, growth)
    console.print(f"Total benchmark runtime: {runtime:.1f} s; {steal_text(steal)}")
    if not args.no_write:
        sizes = {n: table[n] for n in backends}
        body = markdown(machine, throughput, growth, sizes, runtime, steal, args.quick)
        write_section(SECTION, body, args.output)
        console.print(f"Wrote the {SECTION} section of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
