"""Benchmark ``affidavit worker --processes N``: PostgreSQL tool steps per second of N worker
processes at the same total concurrency (N × ``--concurrency``), in one run on one machine.

Each configuration runs the same jobs (default 1,000 jobs × 5 chained tool steps, a fresh schema
each time, dropped afterwards) by one whole ``affidavit worker --until-idle`` command — process
start to exit, so the supervisor's and its children's start-up count — alternating the
configurations over the repetitions; the table gives the median steps/s of each and its ratio to
one process. The goal (docs/PERFORMANCE.md): 2 processes ≥ 1.4 × 1 process on 2 cores.

Usage (from the repository root)::

    python -m benchmarks.bench_processes            # writes docs/PERFORMANCE.md
    python -m benchmarks.bench_processes --quick --no-write
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from benchmarks._report import (
    PERFORMANCE_MD,
    byte_compile_affidavit,
    describe_machine,
    markdown_table,
    median,
    spread,
    write_section,
    yes_no,
)
from benchmarks.steps_pg import reachable, run_affidavit

SECTION = "bench_processes"
PG_URL = os.environ.get("AFFIDAVIT_BENCH_PG_URL", "postgresql://root@127.0.0.1:5432/test")
TOTAL_CONCURRENCY = 4
CONFIGS = [(1, 4), (2, 2), (4, 1)]  # (processes, jobs at once in each)
GOAL = 1.4  # 2 processes ÷ 1
console = Console()


def measure(jobs: int, steps: int, reps: int) -> dict[tuple[int, int], list[float]]:
    runs: dict[tuple[int, int], list[float]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            for processes, concurrency in CONFIGS:
                rate, _ = run_affidavit(
                    PG_URL, jobs, steps, Path(tmp), processes=processes, concurrency=concurrency
                )
                runs[(processes, concurrency)].append(rate)
                console.print(
                    f"rep {rep + 1}: {processes} × {concurrency}: {rate:,.0f} steps/s",
                    highlight=False,
                )
    return runs


def report(runs: dict[tuple[int, int], list[float]], jobs: int, steps: int, pg: str) -> str:
    base = median(runs[CONFIGS[0]])
    rows = []
    for (processes, concurrency), rates in runs.items():
        ratio = median(rates) / base
        rows.append(
            [
                f"{processes} × {concurrency}",
                spread(rates),
                f"{median(rates):,.0f}",
                f"{ratio:.2f}×",
            ]
        )
    two = median(runs[(2, 2)]) / base
    machine = describe_machine(pg)
    table = markdown_table(
        ["processes × jobs at once", "steps/s (runs)", "median", "÷ 1 process"], rows, "lrrr"
    )
    goal = markdown_table(
        ["goal", "measured", "met"],
        [[f"2 processes ≥ {GOAL}× 1 process", f"{two:.2f}×", yes_no(two >= GOAL)]],
        "lrr",
    )
    lines = [f"- {k}: {v}" for k, v in machine.rows()]
    return (
        f"## Worker processes (bench_processes)\n\n{goal}\n\n{table}\n\n"
        f"PostgreSQL, {jobs} jobs × {steps} chained tool steps, total concurrency "
        f"{TOTAL_CONCURRENCY}, whole `affidavit worker --until-idle` command (start-up "
        f"included), {len(runs[CONFIGS[0]])} alternating repetitions.\n\n" + "\n".join(lines)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 jobs, 1 repetition")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs of 5 tool steps each")
    parser.add_argument("--output", type=Path, default=PERFORMANCE_MD)
    args = parser.parse_args(argv)
    pg = reachable(PG_URL, console.print)
    if pg is None:
        return 1
    byte_compile_affidavit()
    jobs, steps, reps = (60, 5, 1) if args.quick else (args.jobs, 5, 3)
    body = report(measure(jobs, steps, reps), jobs, steps, pg)
    console.print(body, highlight=False)
    if not args.no_write:
        write_section(SECTION, body, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
