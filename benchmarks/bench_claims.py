"""Benchmark the claim service's own overhead per verification.

For each backend (SQLite in a fresh temporary file, PostgreSQL in a fresh schema dropped
afterwards) it times, interleaved in one run:

* bare: ``subprocess.run(["true"])`` — the cost of spawning the command alone;
* sandbox: the bubblewrap sandbox running ``true`` (argument policy, new namespaces, read-only
  binds, private /tmp, scrubbed environment, rlimits, capped capture) without database work;
* unsandboxed: the same with ``isolation="none"`` (the operator's opt-out: a plain child);
* verify: ``ClaimService.verify_claim`` with the command ``true`` — sandbox, judging, the
  evidence record, the trust update and the trust-log append, durable commit included.

It reports p50 and p95 of each, the sandbox's cost beyond the bare spawn (goal: p95 ≤ 25 ms) and
the overhead of ``verify`` beyond the bare spawn, and writes its section of
``docs/PERFORMANCE.md``.

Usage (from the repository root)::

    python benchmarks/bench_claims.py                      # both backends, writes the doc
    python benchmarks/bench_claims.py --backend sqlite --runs 50 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit.claims import ClaimService, cgroups
from affidavit.claims.rlimits import prlimit
from affidavit.claims.sandbox import SandboxConfig, parse_command, run_command
from affidavit.store import open_store
from benchmarks._report import (
    cpu_ticks,
    describe_machine,
    markdown_table,
    pg_conninfo,
    pg_server_version,
    steal_share,
    steal_text,
    write_section,
    yes_no,
)

SECTION = "bench_claims"
DEFAULT_PG_URL = "postgresql://root@127.0.0.1:5432/test"
GOAL_SANDBOX_P95_MS = 25.0
WARMUP = 20
LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}

console = Console()
if not console.is_terminal:
    console = Console(width=120)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in [0, 1])."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Timings:
    bare: list[float]
    sandbox: list[float]
    unsandboxed: list[float]
    verify: list[float]

    def p(self, series: list[float], q: float) -> float:
        return percentile(series, q)

    @property
    def overhead_p50(self) -> float:
        return self.p(self.verify, 0.50) - self.p(self.bare, 0.50)

    @property
    def overhead_p95(self) -> float:
        return self.p(self.verify, 0.95) - self.p(self.bare, 0.95)

    @property
    def sandbox_p95(self) -> float:
        return self.p(self.sandbox, 0.95) - self.p(self.bare, 0.95)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


@contextmanager
def store_url(backend: str, pg_url: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bench-claims-") as tmp:
            yield f"sqlite:///{tmp}/affidavit.db"
        return
    schema = f"bench_claims_{uuid.uuid4().hex[:12]}"
    conninfo = pg_conninfo(pg_url)
    try:
        yield f"{conninfo}{'&' if '?' in conninfo else '?'}schema={schema}"
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def measure(url: str, runs: int) -> Timings:
    store = open_store(url)
    try:
        svc = ClaimService(store)
        svc.add_agent("claimant", namespace="bench")
        svc.add_agent("verifier", namespace="bench")
        config = SandboxConfig()
        plain = SandboxConfig(isolation="none")
        command = parse_command("true", config)
        cases: dict[str, Callable[[], object]] = {
            "bare": lambda: subprocess.run(["true"], check=True),
            "sandbox": lambda: run_command(command, config),
            "unsandboxed": lambda: run_command(command, plain),
            "verify": lambda: svc.verify_claim(
                "claimant", "custom", {"return_code": 0}, "true", "verifier"
            ),
        }
        for _ in range(WARMUP):
            for fn in cases.values():
                fn()
        series: dict[str, list[float]] = {name: [] for name in cases}
        for i in range(runs):
            order = list(cases.items())
            if i % 2:
                order.reverse()  # neither case always runs first
            for name, fn in order:
                series[name].append(timed(fn))
        return Timings(series["bare"], series["sandbox"], series["unsandboxed"], series["verify"])
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    pg_version = pg_server_version(args.pg_url) if "postgresql" in backends else None
    machine = describe_machine(pg_version)
    ticks = cpu_ticks()
    started = time.perf_counter()
    results: dict[str, Timings] = {}
    for backend in backends:
        with store_url(backend, args.pg_url) as url:
            console.print(f"[bold]{LABELS[backend]}[/]: {args.runs} runs of each case …")
            results[backend] = measure(url, args.runs)
    elapsed = time.perf_counter() - started
    steal = steal_share(ticks, cpu_ticks())

    headers = [
        "backend",
        "bare `true` p50 / p95",
        "unsandboxed p50 / p95",
        "bubblewrap sandbox p50 / p95",
        "sandbox beyond bare, p95",
        "`verify_claim` p50 / p95",
        "`verify_claim` beyond bare p50 / p95",
        "goal met (sandbox p95 ≤ bare + 25 ms)",
    ]
    rows = []
    for backend, t in results.items():
        rows.append(
            [
                LABELS[backend],
                f"{t.p(t.bare, 0.5):.2f} / {t.p(t.bare, 0.95):.2f} ms",
                f"{t.p(t.unsandboxed, 0.5):.2f} / {t.p(t.unsandboxed, 0.95):.2f} ms",
                f"{t.p(t.sandbox, 0.5):.2f} / {t.p(t.sandbox, 0.95):.2f} ms",
                f"{t.sandbox_p95:.2f} ms",
                f"{t.p(t.verify, 0.5):.2f} / {t.p(t.verify, 0.95):.2f} ms",
                f"{t.overhead_p50:.2f} / {t.overhead_p95:.2f} ms",
                yes_no(t.sandbox_p95 <= GOAL_SANDBOX_P95_MS),
            ]
        )
    table = Table(*headers)
    for row in rows:
        table.add_row(*(cell.replace("**", "") for cell in row))
    console.print(table)
    if args.no_write:
        return
    spawn_path = (
        "a `preexec_fn` that joins the claim's cgroup leaf (Python must `fork` and run code in "
        "the child), then util-linux `prlimit` for the per-process limits"
        if cgroups.support().kind
        else "util-linux `prlimit` (set the limits, then exec the program; Python spawns with "
        "`vfork`)"
        if prlimit() is not None
        else "a `preexec_fn` (Python must `fork` and run code in the child)"
    )
    body = (
        "## Claim verification overhead (`benchmarks/bench_claims.py`)\n\n"
        "Measured on:\n\n"
        + machine.markdown()
        + f"- Benchmark runtime: {elapsed:.0f} s; {steal_text(steal)}\n\n"
        f"Each case runs {args.runs} times after {WARMUP} warm-up runs, interleaved (the order "
        'alternates every round). Bare = `subprocess.run(["true"])`. Sandbox = the claim '
        "sandbox running `true` in bubblewrap (argument policy; new user, pid, network, IPC "
        "and UTS namespaces; read-only binds of the system and interpreter; private `/tmp`; "
        "scrubbed environment; CPU/memory/file-size/process limits; capped capture of both "
        'streams) with no database work; unsandboxed = the same with `isolation="none"` '
        "(a plain child in a scratch directory). `verify_claim` = the whole "
        'service call with claim `{"return_code": 0}`: the agent checks, the sandboxed run, '
        "judging, the evidence record, the trust update under the agent's row lock and the "
        "trust-log append, committed durably (SQLite `synchronous=FULL`, PostgreSQL "
        "`synchronous_commit=on`). Overhead = `verify_claim` minus bare, at the same "
        "percentile.\n\n"
        + markdown_table(headers, rows, "lrrrrrrl")
        + f"\nLimits were set through {spawn_path}. The sandbox's cost over a bare spawn is "
        "bubblewrap's: creating the namespaces and mounts, its init process, and the "
        "namespace's teardown; the rest of `verify_claim`'s overhead is the durable commit "
        "of the evidence and the trust update. The machine is shared with other work while "
        "this runs (see the steal share above).\n"
    )
    write_section(SECTION, body)
    console.print(f"wrote the {SECTION} section of docs/PERFORMANCE.md")


if __name__ == "__main__":
    main()
