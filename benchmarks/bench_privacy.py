"""Benchmark data subjects: agent steps per second with a subject (every value sealed) against the
same jobs without one, and the time ``affidavit erase`` takes for a subject with 1,000 jobs.

Each case runs in a fresh subprocess, on SQLite and PostgreSQL (a fresh schema), the two
variants alternating so that both see the same machine load:

- steps: J agent jobs of S tool calls each (each call's arguments and result ~200 bytes of JSON),
  run by one process (``Runtime.run_until_idle``); steps/s = J × S ÷ the run's time. The
  baseline is the same jobs without a subject, measured in the same run.
- erase: a subject with N finished one-call jobs (and as many jobs of other subjects beside
  them); the time of ``affidavit.privacy.erase`` — the transaction and the scrub of the files
  (SQLite: secure delete, table rebuild, WAL truncate; PostgreSQL: VACUUM FULL, checkpoints).

Prints a table and writes it as this benchmark's section of ``docs/PERFORMANCE.md``
(``benchmarks/results/bench_privacy.md``).

Usage (from the repository root)::

    python -m benchmarks.bench_privacy                    # default sizes; writes the report
    python -m benchmarks.bench_privacy --quick --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import (
    describe_machine,
    markdown_table,
    median,
    pg_fresh_schema,
    pg_server_version,
    write_section,
)

PG_URL = os.environ.get("AFFIDAVIT_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")
GOAL = 0.90  # steps/s with a subject ÷ without

CHILD = """\
import json
import sys
import time
from pathlib import Path

from affidavit import AgentContext, Runtime, ToolContext, ToolRegistry, agent, tool
from affidavit.core.privacy import FileKeyProvider
from affidavit.privacy import erase

mode, url, tmp, a, b, with_subject = sys.argv[1:7]
master = Path(tmp) / "master.key"
if not master.exists():
    FileKeyProvider.create(master)
NOTE = "x" * 160


@tool("bench_send")
def send(ctx: ToolContext, to: str, note: str) -> dict:
    return {"sent_to": to, "note": note}


@agent("bench_mailer", version="1")
def mailer(ctx: AgentContext, email: str, calls: int) -> int:
    for i in range(calls):
        ctx.call(send, to=f"{email}+{i}", note=NOTE)
    return calls


tools = ToolRegistry([send, mailer])
with Runtime(url, tools=tools, master_key=master, signing_key=Path(tmp) / "seal.key") as rt:
    if mode == "steps":
        jobs, calls = int(a), int(b)
        for j in range(jobs):
            subject = f"customer-{j}" if with_subject == "1" else None
            rt.submit("bench_mailer", {"email": f"u{j}@example.org", "calls": calls},
                      subject=subject)
        t0, c0 = time.perf_counter(), time.process_time()
        rt.run_until_idle()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"steps_per_s": jobs * calls / elapsed, "seconds": elapsed,
                          "cpu_us_per_step": cpu / (jobs * calls) * 1e6}))
    else:
        n = int(a)
        for j in range(n):
            for subject in ("customer-7", f"other-{j}"):
                rt.submit("bench_mailer", {"email": f"u{j}@example.org", "calls": 1},
                          subject=subject)
        rt.run_until_idle()
        t0 = time.perf_counter()
        done = erase(rt.store, "customer-7", sealer=rt.sealer, reason="benchmark")
        elapsed = time.perf_counter() - t0
        assert len(done.receipt["receipt"]["job_ids"]) == n
        print(json.dumps({"seconds": elapsed, "scrubbed": done.scrubbed}))
"""


def _child(script: Path, *args: object) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{args[0]} exited {proc.returncode}: {proc.stderr[-1500:]}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def _urls(backend: str, tmp: Path, tag: str) -> Any:
    if backend == "sqlite":
        from contextlib import nullcontext

        return nullcontext(f"sqlite:///{tmp / f'{tag}.db'}")
    return pg_fresh_schema(PG_URL, f"bench_privacy_{tag}")


def run(backend: str, sizes: argparse.Namespace, tmp: Path, script: Path) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"0": [], "1": []}
    cpu: dict[str, list[float]] = {"0": [], "1": []}
    for rep in range(sizes.reps):
        for flag in ("0", "1") if rep % 2 == 0 else ("1", "0"):
            with _urls(backend, tmp, f"steps{rep}{flag}") as url:
                report = _child(script, "steps", url, tmp, sizes.jobs, sizes.calls, flag)
            rates[flag].append(report["steps_per_s"])
            cpu[flag].append(report["cpu_us_per_step"])
    with _urls(backend, tmp, "erase") as url:
        erased = _child(script, "erase", url, tmp, sizes.erase_jobs, 0, "1")
    plain, sealed = median(rates["0"]), median(rates["1"])
    return {
        "without": plain,
        "with": sealed,
        "ratio": sealed / plain,
        "cpu_without": median(cpu["0"]),
        "cpu_with": median(cpu["1"]),
        "erase_s": erased["seconds"],
        "scrubbed": erased["scrubbed"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--no-write", action="store_true", help="do not write the report")
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), action="append")
    args = parser.parse_args()
    sizes = argparse.Namespace(
        jobs=10 if args.quick else 50,
        calls=5 if args.quick else 20,
        reps=1 if args.quick else 3,
        erase_jobs=50 if args.quick else 1000,
    )
    backends = args.backend or ["sqlite", "postgresql"]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-privacy-") as d:
        script = Path(d) / "privacy_child.py"
        script.write_text(CHILD, encoding="utf-8")
        for backend in backends:
            results[backend] = run(backend, sizes, Path(d), script)
            r = results[backend]
            print(
                f"{backend}: {r['without']:,.0f} steps/s without a subject, {r['with']:,.0f} "
                f"with ({r['ratio']:.0%}); erase of {sizes.erase_jobs:,} jobs "
                f"{r['erase_s']:.2f} s (scrubbed: {r['scrubbed']})"
            )
    pg_version = pg_server_version(PG_URL) if "postgresql" in backends else None
    machine = describe_machine(pg_version)
    rows = [
        [
            backend,
            f"{r['without']:,.0f}",
            f"{r['with']:,.0f}",
            f"{r['ratio']:.0%}",
            "yes" if r["ratio"] >= GOAL else "no",
            f"{r['cpu_without']:,.0f} / {r['cpu_with']:,.0f}",
            f"{r['erase_s']:.2f}",
        ]
        for backend, r in results.items()
    ]
    table = markdown_table(
        [
            "backend",
            "steps/s, no subject",
            "steps/s, with subject",
            "ratio",
            f"goal ≥ {GOAL:.0%}",
            "CPU µs/step, without / with",
            f"erase, {sizes.erase_jobs:,} jobs (s)",
        ],
        rows,
        "lrrrlrr",
    )
    body = f"""## Data subjects (`benchmarks/bench_privacy.py`)

Agent steps per second with every value sealed under a subject's key, against the same jobs
without a subject (the baseline, measured in the same run, alternating); and the time to erase
a subject with {sizes.erase_jobs:,} finished jobs (the transaction and the scrub of the
database's files).

{table}

{machine.markdown()}- {sizes.jobs} jobs × {sizes.calls} tool calls per case, median of
  {sizes.reps} repetition(s); each case in a fresh process and a fresh database.
- The CPU column is the run's process CPU time per step (the sealing's own cost, which the
  machine's load disturbs less than the wall clock). A run on a shared, loaded machine (see the
  load average) says little about the steps/s ratio: both variants wait on the same syncs.
"""
    print(table)
    if not args.no_write:
        write_section("bench_privacy", body)


if __name__ == "__main__":
    main()
