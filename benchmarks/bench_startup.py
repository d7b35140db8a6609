"""Benchmark start-up: what an ``affidavit`` call pays before it does anything, against the bare
interpreter measured in the same run.

Each measurement starts a fresh process (median of ``--reps``, after one warm-up run each):

* ``python -c pass``: the baseline — the interpreter alone;
* ``python -c "import affidavit"``: the package's public API, imported as a program would;
* ``affidavit --version``: the console script, as scripts and MCP/stdio hosts call it;
* ``affidavit jobs list --db <empty SQLite file>``: a real command, store opened and read;
* the everyday commands on a SQLite file holding one finished refund job (the demo's agent):
  ``submit`` (a plan checked against its tools and enqueued; a new job each run),
  ``jobs list``, ``jobs show JOB`` and ``verify JOB``, human output as a user reads it.

Goals (on an idle machine of this kind): ``affidavit --version`` in at most 0.15 s, and each of
the four everyday commands in at most 0.15 s from process start to exit. The table also gives
each time minus the baseline, which a loaded machine inflates less.

Usage (from the repository root)::

    python benchmarks/bench_startup.py                  # writes docs/PERFORMANCE.md
    python benchmarks/bench_startup.py --reps 3 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import (
    byte_compile_affidavit,
    describe_machine,
    markdown_table,
    median,
    write_section,
    yes_no,
)

SECTION = "bench_startup"
GOAL_VERSION_S = 0.15
GOAL_COMMAND_S = 0.15
EVERYDAY = ("submit", "jobs list", "jobs show", "verify")
BIN = Path(sys.executable).parent


def clock(argv: Sequence[str], reps: int) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system) of ``argv`` as a fresh process,
    after one warm-up run. The CPU time is what a loaded machine inflates least: a process
    waiting for a core is not charged for the wait."""
    subprocess.run(argv, check=True, capture_output=True)
    walls, cpus = [], []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return median(walls), median(cpus)


def finished_job(affidavit: str, tmp: Path, url: str) -> tuple[list[str], str]:
    """The ``submit`` arguments of a refund job (its plan file, tools and input) and the id of
    one such job run to its end on ``url``."""
    from affidavit.examples import refund

    refund.setup_shop(tmp / "shop")
    plan = tmp / "refund.json"
    plan.write_text(json.dumps(refund.PLAN), encoding="utf-8")
    job_input = json.dumps({"order_id": "A-1001", "data_dir": str(tmp / "shop")})
    submit = [str(plan), "--tools", "affidavit.examples.refund", "--input", job_input]
    ran = subprocess.run(
        [affidavit, "run", *submit, "--db", url, "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    return submit, str(json.loads(ran.stdout)["job_id"])


def run(reps: int) -> list[tuple[str, tuple[float, float]]]:
    affidavit = str(BIN / "affidavit")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'empty.db'}"
        subprocess.run([affidavit, "db", "migrate", "--db", url], check=True, capture_output=True)
        jobs = f"sqlite:///{Path(tmp) / 'jobs.db'}"
        submit, job_id = finished_job(affidavit, Path(tmp), jobs)
        cases = [
            ("`python -c pass` (baseline)", [sys.executable, "-c", "pass"]),
            ('`python -c "import affidavit"`', [sys.executable, "-c", "import affidavit"]),
            ("`affidavit --version`", [affidavit, "--version"]),
            ("`affidavit jobs list` (empty SQLite)", [affidavit, "jobs", "list", "--db", url]),
            ("`affidavit submit`", [affidavit, "submit", *submit, "--db", jobs]),
            ("`affidavit jobs list`", [affidavit, "jobs", "list", "--db", jobs]),
            ("`affidavit jobs show`", [affidavit, "jobs", "show", job_id, "--db", jobs]),
            ("`affidavit verify`", [affidavit, "verify", job_id, "--db", jobs]),
        ]
        return [(name, clock(argv, reps)) for name, argv in cases]


def markdown(results: list[tuple[str, tuple[float, float]]], machine: str, reps: int) -> str:
    baseline, baseline_cpu = results[0][1]
    rows = [
        [
            name,
            f"{t * 1000:,.0f} ms",
            f"{(t - baseline) * 1000:+,.0f} ms",
            f"{t / baseline:.1f}×",
            f"{cpu * 1000:,.0f} ms",
            f"{(cpu - baseline_cpu) * 1000:+,.0f} ms",
        ]
        for name, (t, cpu) in results
    ]
    times = {name: t for name, (t, _) in results}
    version = times["`affidavit --version`"]
    goals = [
        [
            f"`affidavit --version` ≤ {GOAL_VERSION_S * 1000:.0f} ms",
            f"{version * 1000:,.0f} ms",
            yes_no(version <= GOAL_VERSION_S),
        ]
    ]
    for command in EVERYDAY:
        t = times[f"`affidavit {command}`"]
        goals.append(
            [
                f"`affidavit {command}` ≤ {GOAL_COMMAND_S * 1000:.0f} ms",
                f"{t * 1000:,.0f} ms",
                yes_no(t <= GOAL_COMMAND_S),
            ]
        )
    return (
        "## Start-up (`benchmarks/bench_startup.py`)\n\n"
        "Measured on:\n\n"
        f"{machine}\n"
        f"Each a fresh process; median of {reps} runs after a warm-up run. The everyday "
        "commands run on a SQLite file holding one finished refund job (4 steps, 21 events), "
        "human output; `submit` enqueues a new job each run.\n\n"
        + markdown_table(
            ["command", "time", "minus baseline", "× baseline", "CPU time", "CPU minus baseline"],
            rows,
            "lrrrrr",
        )
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
    byte_compile_affidavit()  # (as an installed package is)
    machine = describe_machine(None)
    text = markdown(run(args.reps), machine.markdown(), args.reps)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
