"""Benchmark retention: how many old finished jobs a retention run archives per second — each
exported as a signed pack, written durably, read back and verified, then removed from the live
store in one transaction — on SQLite and PostgreSQL, next to the baseline measured in the same
run: exporting the same packs alone (no write to disk, no verification, no delete). It also
reports the live store's size before and after (SQLite: the file after VACUUM; PostgreSQL: the
job tables after VACUUM FULL).

Usage (from the repository root)::

    python benchmarks/bench_retention.py --part retention            # writes docs/PERFORMANCE.md
    python benchmarks/bench_retention.py --part retention --jobs 20 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.packs import export_archive
from affidavit.retention import Retention, set_policy
from affidavit.store import connect_raw, open_store
from affidavit.store.postgres import split_url
from affidavit.tlog import LogKey, Sequencer, default_log_key_path
from benchmarks._report import (
    describe_machine,
    markdown_table,
    median,
    pg_fresh_schema,
    pg_server_version,
    redact,
    write_section,
)

SECTION = "bench_retention"
PG_URL = os.environ.get("AFFIDAVIT_BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/test")
LATER = 10 * 86_400  # retention's clock runs this far ahead: every job is old enough
console = Console(width=120)


def _tools() -> ToolRegistry:
    def echo(ctx: ToolContext, x: int) -> dict[str, int]:
        return {"x": x}

    return ToolRegistry((Tool("echo", echo, "tool"),))


def _plan(steps: int) -> dict[str, Any]:
    nodes = [
        {"id": f"s{i}", "type": "tool", "tool": "echo", "args": {"x": i}} for i in range(steps)
    ]
    return {"name": "bench-retention", "nodes": nodes}


def build(url: str, jobs: int, steps: int) -> list[str]:
    """``jobs`` completed jobs of ``steps`` tool steps each, sealed, their seals in the log."""
    with Runtime(url, tools=_tools()) as rt:
        ids = [rt.submit(_plan(steps), {"n": n}).job_id for n in range(jobs)]
        rt.run_until_idle()
        Sequencer(rt.store, LogKey(default_log_key_path(url))).integrate()
    return ids


def live_size(url: str) -> int:
    """The live store's bytes once compacted (see the module docstring)."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        conn = connect_raw(path, autocommit=True)
        try:
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        return Path(path).stat().st_size
    import psycopg
    from psycopg import sql

    conninfo, schema = split_url(url)
    total = 0
    with psycopg.connect(conninfo, autocommit=True) as pg:
        if schema:
            pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for table in ("jobs", "events", "tool_invocations", "job_tags"):
            pg.execute(sql.SQL("VACUUM FULL {}").format(sql.Identifier(table)))
            row = pg.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
            total += int(row[0]) if row else 0
    return total


def retention_once(url: str, root: Path, jobs: int, steps: int) -> dict[str, float]:
    """One measured run on a fresh database at ``url``."""
    ids = build(url, jobs, steps)
    store = open_store(url)
    try:
        started = time.perf_counter()
        for job_id in ids:  # the baseline: the packs exported, nothing else
            export_archive(store, job_id)
        export_s = time.perf_counter() - started
        before = live_size(url)
        set_policy(store, 0, root / "archive")
        started = time.perf_counter()
        report = Retention(store, clock=lambda: time.time() + LATER).run()
        run_s = time.perf_counter() - started
        assert len(report.archived) == jobs and not report.failed, report.failed
        after = live_size(url)
    finally:
        store.close()
    return {"archive_rate": jobs / run_s, "export_rate": jobs / export_s, "before": before,
            "after": after}  # fmt: skip


def retention(jobs: int, steps: int, reps: int, backends: Sequence[str]) -> list[dict[str, Any]]:
    """The ``retention`` part: median of ``reps`` runs per backend."""
    rows = []
    for backend in backends:
        runs = []
        for rep in range(reps):
            with tempfile.TemporaryDirectory(prefix="bench_retention_") as tmp:
                root = Path(tmp)
                os.environ["AFFIDAVIT_SIGNING_KEY"] = str(root / "seal.key")
                os.environ["AFFIDAVIT_LOG_KEY"] = str(root / "log.key")
                console.print(f"retention: {backend}, run {rep + 1} of {reps} …")
                if backend == "sqlite":
                    runs.append(retention_once(f"sqlite:///{root / 'bench.db'}", root, jobs, steps))
                else:
                    with pg_fresh_schema(PG_URL, "bench_retention") as url:
                        runs.append(retention_once(url, root, jobs, steps))
        rows.append(
            {"backend": backend}
            | {k: median([r[k] for r in runs]) for k in ("archive_rate", "export_rate")}
            | {k: runs[-1][k] for k in ("before", "after")}
        )
    return rows


HEADERS = (
    "backend",
    "jobs archived/s",
    "packs exported/s (baseline)",
    "ratio",
    "live store (compacted)",
)


def under_load() -> str:
    """``; under load (…)`` when the machine was busier than its cores at the start, else ``""``:
    the numbers are then labelled so."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    return f"; under load: load average {load:.1f} on {cores} cores" if load > cores else ""


def retention_markdown(
    rows: list[dict[str, Any]], jobs: int, steps: int, reps: int, load: str = ""
) -> str:
    table = [
        (
            r["backend"],
            f"{r['archive_rate']:,.1f}",
            f"{r['export_rate']:,.1f}",
            f"{r['archive_rate'] / r['export_rate']:.2f}×",
            f"{r['before'] / 1e6:.2f} MB → {r['after'] / 1e6:.2f} MB",
        )
        for r in rows
    ]
    return (
        f"### Retention (`--part retention`{load})\n\n"
        f"{jobs} completed, sealed jobs of {steps} tool steps each; one retention run archives "
        "every one (pack exported, written and flushed to disk, read back and verified, then "
        "the job deleted in one transaction). Baseline, same run: exporting the same packs "
        f"alone. Median of {reps} runs.\n\n"
        + markdown_table(
            [
                "backend",
                "jobs archived/s",
                "packs exported/s (baseline)",
                "ratio",
                "live store (compacted)",
            ],
            table,
            "lrrrl",
        )
        + "\n\nThe time is the packs': exporting one and verifying it (phases 1–5, a replay of "
        "its log) cost about the same, and the delete is a few statements.\n"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["retention"], default="retention", help="what to measure")
    p.add_argument("--jobs", type=int, default=200, help="jobs archived per run (default 200)")
    p.add_argument("--steps", type=int, default=5, help="tool steps per job (default 5)")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    p.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    p.add_argument("--no-write", action="store_true", help="do not update docs/PERFORMANCE.md")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    backends = ["sqlite"] if args.sqlite_only else ["sqlite", "postgresql"]
    machine = describe_machine(None if args.sqlite_only else pg_server_version(PG_URL))
    load = under_load()
    rows = retention(args.jobs, args.steps, args.reps, backends)
    text = (
        "## Privacy and retention (`benchmarks/bench_retention.py`)\n\n"
        f"Measured on:\n\n{machine.markdown()}\n"
        + ("" if args.sqlite_only else f"PostgreSQL: {redact(PG_URL)}.\n\n")
        + retention_markdown(rows, args.jobs, args.steps, args.reps, load)
    )
    console.print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
