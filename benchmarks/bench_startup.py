"""Benchmark start-up: what an ``affidavit`` call pays before it does anything, against the bare
interpreter measured in the same run.

Each measurement starts a fresh process (median of ``--reps``, after one warm-up run each):

* ``python -c pass``: the baseline — the interpreter alone;
* ``python -c "import affidavit"``: the package's public API, imported as a program would;
* ``affidavit --version``: the console script, as scripts and MCP/stdio hosts call it;
* ``affidavit jobs list --db <empty SQLite file>``: a real command, store opened and read.

Goal: ``affidavit --version`` in at most 0.15 s (on an idle machine of this kind). The table
also gives each time minus the baseline, which a loaded machine inflates less.

Usage (from the repository root)::

    python benchmarks/bench_startup.py                  # writes docs/PERFORMANCE.md
    python benchmarks/bench_startup.py --reps 3 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import describe_machine, markdown_table, median, write_section, yes_no

SECTION = "bench_startup"
GOAL_VERSION_S = 0.15
BIN = Path(sys.executable).parent


def clock(argv: Sequence[str], reps: int) -> float:
    """Median wall time of ``argv`` as a fresh process, after one warm-up run."""
    subprocess.run(argv, check=True, capture_output=True)
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        runs.append(time.perf_counter() - start)
    return median(runs)


def run(reps: int) -> list[tuple[str, float]]:
    affidavit = str(BIN / "affidavit")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'empty.db'}"
        subprocess.run([affidavit, "db", "migrate", "--db", url], check=True, capture_output=True)
        cases = [
            ("`python -c pass` (baseline)", [sys.executable, "-c", "pass"]),
            ('`python -c "import affidavit"`', [sys.executable, "-c", "import affidavit"]),
            ("`affidavit --version`", [affidavit, "--version"]),
            ("`affidavit jobs list` (empty SQLite)", [affidavit, "jobs", "list", "--db", url]),
        ]
        return [(name, clock(argv, reps)) for name, argv in cases]


def markdown(results: list[tuple[str, float]], machine: str, reps: int) -> str:
    baseline = results[0][1]
    rows = [
        [name, f"{t * 1000:,.0f} ms", f"{(t - baseline) * 1000:+,.0f} ms", f"{t / baseline:.1f}×"]
        for name, t in results
    ]
    version = dict(results)["`affidavit --version`"]
    goals = [
        [
            f"`affidavit --version` ≤ {GOAL_VERSION_S * 1000:.0f} ms",
            f"{version * 1000:,.0f} ms",
            yes_no(version <= GOAL_VERSION_S),
        ]
    ]
    return (
        "## Start-up (`benchmarks/bench_startup.py`)\n\n"
        "Measured on:\n\n"
        f"{machine}\n"
        f"Each a fresh process; median of {reps} runs after a warm-up run.\n\n"
        + markdown_table(["command", "time", "minus baseline", "× baseline"], rows, "lrrr")
        + "\n\n"
        + markdown_table(["goal", "measured", "met"], goals, "lrl")
        + "\n"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=15, help="repetitions (median reported)")
    p.add_argument("--no-write", action="store_true", help="do not update docs/PERFORMANCE.md")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    machine = describe_machine(None)
    text = markdown(run(args.reps), machine.markdown(), args.reps)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
