"""Benchmark selective disclosure and what seal v2 adds to sealing.

For each backend (SQLite in a fresh temporary file, PostgreSQL in a fresh schema dropped
afterwards), on jobs of 50 events (a ``job_created`` and 7 steps of 7 events, ~250-byte
payloads):

* sealing, one durable transaction per job: a v1 seal as before seal v2 (sign the head, store
  the seal, queue its log leaf) against the v2 seal the runtime now makes
  (``Sealer.seal_txn``: also read the job's 50 chain hashes and compute ``events_root``), in µs
  per seal (median); and ``events_root`` over 50 hashes alone;
* disclosure: ``affidavit.tlog.disclose`` of one 7-event step (one snapshot, the whole log, the
  tree, 7 proofs; the job is not in the transparency log) per second, and
  ``verify_disclosure`` of the file per second.

Usage (from the repository root)::

    python -m benchmarks.bench_disclose                     # both backends, writes the report
    python -m benchmarks.bench_disclose --quick --no-write  # smoke test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit.core.events import utc_now
from affidavit.core.seal import events_root, log_leaf
from affidavit.core.signing import SigningKey
from affidavit.record import Sealer
from affidavit.store import NewEvent, Store, open_store
from affidavit.tlog import disclose, encode_disclosure, verify_disclosure
from benchmarks._report import (
    describe_machine,
    markdown_table,
    pg_fresh_schema,
    pg_server_version,
    write_section,
)

PG_URL = os.environ.get("AFFIDAVIT_BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/test")
STEPS = 7
STEP_TYPES = (
    "node_started",
    "tool_invocation_started",
    "tool_invocation_finished",
    "command_committed",
    "state_changed",
    "confirmation_warning",
    "node_finished",
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--jobs", type=int, default=300, help="jobs sealed each way")
    p.add_argument("--seconds", type=float, default=3.0, help="per throughput measurement")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.jobs, args.seconds = 20, 0.5
    return args


def make_job(store: Store) -> tuple[str, tuple[int, str]]:
    """A job of 50 events; its head (version, chain hash)."""
    job, _ = store.create_job(
        plan_name="bench-disclose",
        events=[NewEvent("job_created", {"at": utc_now(), "input": {"order": "A-1"}})],
    )
    events = [
        NewEvent(
            kind,
            {
                "at": utc_now(),
                "node_id": f"n{s}",
                "step_id": f"{s:016x}",
                "detail": {"amount": 100 + s, "note": "x" * 160, "kind": kind},
            },
        )
        for s in range(STEPS)
        for kind in STEP_TYPES
    ]
    stored = store.append(job.job_id, events, expected_version=1)
    return job.job_id, (stored[-1].version, stored[-1].chain_hash)


def median_us(times: list[float]) -> float:
    return statistics.median(times) * 1e6


def seal_v1(store: Store, key: SigningKey, job_id: str, head: tuple[int, str]) -> None:
    """Sealing as it was before seal v2."""
    with store.transaction(durable=True) as tx:
        seal = key.seal(job_id, *head)
        tx.key_register(key.public, created_at=seal.sealed_at)
        if tx.seal_insert(seal):
            tx.tlog_enqueue(job_id, log_leaf(seal), time.time())


def seal_v2(store: Store, sealer: Sealer, job_id: str, head: tuple[int, str]) -> None:
    with store.transaction(durable=True) as tx:
        sealer.seal_txn(tx, job_id, head=head)


def rate(fn: Callable[[], object], seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        n += 1
    return n / elapsed


def run_backend(url: str, key_dir: Path, args: argparse.Namespace) -> list[str]:
    store = open_store(url)
    try:
        key = SigningKey.load_or_create(key_dir / "seal.key")
        sealer = Sealer(key=key)
        sealer.admit(store)  # as a worker does when it starts: not per seal
        jobs = [make_job(store) for _ in range(2 * args.jobs)]
        v1_times: list[float] = []
        v2_times: list[float] = []
        # interleaved, so that both see the same database size and machine load
        for (a, head_a), (b, head_b) in zip(jobs[::2], jobs[1::2], strict=True):
            t0 = time.perf_counter()
            seal_v1(store, key, a, head_a)
            t1 = time.perf_counter()
            seal_v2(store, sealer, b, head_b)
            v2_times.append(time.perf_counter() - t1)
            v1_times.append(t1 - t0)
        v2_job = jobs[1][0]
        hashes = [bytes.fromhex(e.chain_hash) for e in store.list_events(v2_job)]
        root_times = []
        for _ in range(200):
            t = time.perf_counter()
            events_root(hashes)
            root_times.append(time.perf_counter() - t)
        selector = f"n{STEPS // 2}"
        data = encode_disclosure(disclose(store, v2_job, selector))
        assert verify_disclosure(data, [key.public_raw]).ok
        made = rate(lambda: disclose(store, v2_job, selector), args.seconds)
        checked = rate(lambda: verify_disclosure(data, [key.public_raw]), args.seconds)
    finally:
        store.close()
    backend = "SQLite" if url.startswith("sqlite") else "PostgreSQL"
    v1, v2 = median_us(v1_times), median_us(v2_times)
    return [
        backend,
        f"{v1:,.0f}",
        f"{v2:,.0f}",
        f"{v2 - v1:+,.0f}",
        f"{median_us(root_times):,.0f}",
        f"{made:,.0f}",
        f"{checked:,.0f}",
        f"{len(data):,}",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    rows = []
    pg_version = None
    with tempfile.TemporaryDirectory(prefix="bench-disclose-") as tmp:
        for backend in backends:
            if backend == "sqlite":
                rows.append(run_backend(f"sqlite:///{tmp}/bench.db", Path(tmp), args))
            else:
                pg_version = pg_server_version(PG_URL)
                with pg_fresh_schema(PG_URL, "bench_disclose") as url:
                    rows.append(run_backend(url, Path(tmp), args))
    headers = [
        "backend",
        "seal v1 (µs, median)",
        "seal v2 (µs, median)",
        "v2 − v1 (µs)",
        "events_root of 50 (µs)",
        "disclosures made/s",
        "disclosures verified/s",
        "file bytes",
    ]
    table = markdown_table(headers, rows, "l" + "r" * (len(headers) - 1))
    body = (
        "## Selective disclosure (`bench_disclose`)\n\n"
        + describe_machine(pg_version).markdown()
        + "\n"
        + ("\n> **Quick mode**: smoke-test sizes; not representative.\n" if args.quick else "")
        + f"\nJobs of 50 events; {args.jobs} seals each way, one durable transaction per seal, "
        "v1 and v2 interleaved (v2 also reads the job's chain hashes and computes "
        "events_root). Disclosure of one 7-event step of such a job (not in the transparency "
        f"log), and verification of that file with the seal key; {args.seconds:g} s each. "
        "The machine is shared with other work (2 cores): treat the numbers as a floor.\n\n"
        + table
        + "\n"
    )
    print(body)
    if not args.no_write:
        write_section("bench_disclose", body)


if __name__ == "__main__":
    main()
