"""Benchmark proof packs: export and verify the pack of a 10,000-step job, next to assay's
verifier on the same pack and the bare cost of reading and hashing every file of it.

It builds one sealed, completed job in a fresh SQLite file (10,000 tool steps and one pure step,
shaped like a real run: see ``bench_verify.build_job``) and measures, median of ``--reps``:

* ``export_pack``: the job to a signed pack directory (read, verify the log, write);
* ``verify_pack``: phases 1–5 in-process (5 re-verifies the job's 50,000-event log);
* assay's ``verify_rce_pack`` in-process on the same pack (phases 1–4);
* ``affidavit rce-verify`` and ``assay rce-verify`` as processes (start-up included);
* the bare limit: reading every file of the pack and SHA-256 hashing its bytes, nothing else.

Goals: our verify ≥ 3× faster than assay's; our verify within 4× of the bare limit; the whole
``rce-verify`` process ≥ 6× faster than assay's (its CPU time reported too: under load, wall
time is mostly waiting). Where the process's CPU goes: each import alone, as a process.

Usage (from the repository root)::

    python benchmarks/bench_packs.py                    # writes docs/PERFORMANCE.md
    python benchmarks/bench_packs.py --steps 500 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from affidavit import SigningKey
from affidavit.packs import export_pack, verify_pack
from affidavit.record import Sealer
from affidavit.store import open_store
from benchmarks._report import (
    byte_compile_affidavit,
    describe_machine,
    markdown_table,
    median,
    write_section,
    yes_no,
)
from benchmarks.bench_verify import build_job

SECTION = "bench_packs"
GOAL_VS_ASSAY = 3.0
GOAL_VS_LIMIT = 4.0
GOAL_CLI_VS_ASSAY = 6.0  # whole process, start-up included (issue 50, at 2,000 steps)
BIN = Path(sys.executable).parent
console = Console(width=120)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def children_cpu() -> float:
    """CPU seconds (user + system) of the child processes waited for so far: a process's own
    work, which a loaded machine stretches less than its wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# Where a whole `rce-verify` process spends its CPU: each of these run alone as a process
STARTUP = {
    "the interpreter alone": "pass",
    "`import affidavit.cli.main` (the command line)": "import affidavit.cli.main",
    "`import affidavit.packs.verify` (the verifier)": "import affidavit.packs.verify",
    "`import jsonschema` (the schema checks)": "import jsonschema",
}


def startup_cpu(reps: int) -> dict[str, float]:
    """Median CPU seconds of a process doing only each of ``STARTUP``."""
    found: dict[str, float] = {}
    for label, code in STARTUP.items():
        runs = []
        for _ in range(reps):
            before = children_cpu()
            subprocess.run([sys.executable, "-c", code], check=True)
            runs.append(children_cpu() - before)
        found[label] = median(runs)
    return found


def read_and_hash(pack: Path) -> int:
    total = 0
    for path in sorted(pack.rglob("*")):
        if path.is_file():
            total += len(hashlib.sha256(path.read_bytes()).digest())
    return total


def run(steps: int, reps: int) -> dict[str, Any]:
    from assay.rce_verify import verify_rce_pack

    with tempfile.TemporaryDirectory(prefix="bench_packs_") as tmp:
        root = Path(tmp)
        store = open_store(f"sqlite:///{root / 'bench.db'}")
        key = SigningKey.generate()
        sealer = Sealer(key=key)
        console.print(f"building a job of {steps:,} tool steps …")
        job_id = build_job(store, steps * 5 + 5, sealer)
        export_s: list[float] = []
        for i in range(reps):
            seconds, result = timed(
                lambda i=i: export_pack(store, job_id, root / f"pack{i}", signing_key=key)
            )
            export_s.append(seconds)
        pack = result.pack_dir
        files = [p for p in pack.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        ours_s, assay_s, limit_s, ours_cli_s, assay_cli_s = [], [], [], [], []
        cpu: dict[str, list[float]] = {"affidavit": [], "assay": []}  # the child's CPU seconds
        env = {**os.environ, "HOME": str(root)}
        for i in range(reps):
            seconds, verdict = timed(lambda: verify_pack(pack))
            assert verdict.verdict == "MATCH", verdict.errors[:5]
            ours_s.append(seconds)
            seconds, (receipt, _, code) = timed(lambda: verify_rce_pack(pack))
            assert (receipt["verdict"], code) == ("MATCH", 0)
            assay_s.append(seconds)
            limit_s.append(timed(lambda: read_and_hash(pack))[0])
            for name, out in ((BIN / "affidavit", ours_cli_s), (BIN / "assay", assay_cli_s)):
                cmd = [str(name), "rce-verify", str(pack), "--out-dir", str(root / f"o{i}")]
                before = children_cpu()
                seconds, proc = timed(
                    lambda cmd=cmd: subprocess.run(
                        [*cmd, "--overwrite"], capture_output=True, env=env, check=False
                    )
                )
                assert proc.returncode == 0, proc.stdout + proc.stderr
                out.append(seconds)
                cpu[name.name].append(children_cpu() - before)
        store.close()
    return {
        "steps": steps,
        "events": steps * 5 + 5,
        "files": len(files),
        "bytes": size,
        "export": median(export_s),
        "ours": median(ours_s),
        "assay": median(assay_s),
        "limit": median(limit_s),
        "ours_cli": median(ours_cli_s),
        "assay_cli": median(assay_cli_s),
        "ours_cli_cpu": median(cpu["affidavit"]),
        "startup": startup_cpu(reps),
        "assay_cli_cpu": median(cpu["assay"]),
    }


def markdown(r: dict[str, Any], machine: str, reps: int) -> str:
    vs_assay = r["assay"] / r["ours"]
    vs_limit = r["ours"] / r["limit"]
    vs_cli = r["assay_cli"] / r["ours_cli"]
    startup = [(k, f"{v:.3f}") for k, v in r["startup"].items()]
    startup.append(("the whole `affidavit rce-verify`", f"{r['ours_cli_cpu']:.3f}"))
    vs_cli_cpu = r["assay_cli_cpu"] / r["ours_cli_cpu"]
    rows = [
        ("`export_pack` (job → signed pack)", f"{r['export']:.2f} s"),
        ("`verify_pack` (phases 1–5, in-process)", f"{r['ours']:.2f} s"),
        ("assay `verify_rce_pack` (phases 1–4, in-process)", f"{r['assay']:.2f} s"),
        ("`affidavit rce-verify` (process)", f"{r['ours_cli']:.2f} s"),
        ("`assay rce-verify` (process)", f"{r['assay_cli']:.2f} s"),
        ("`affidavit rce-verify` (process), CPU", f"{r['ours_cli_cpu']:.2f} s"),
        ("`assay rce-verify` (process), CPU", f"{r['assay_cli_cpu']:.2f} s"),
        ("limit: read + SHA-256 every file of the pack", f"{r['limit']:.3f} s"),
    ]
    goals = [
        (
            f"our verify ≥ {GOAL_VS_ASSAY:.0f}× faster than assay's (in-process)",
            f"{vs_assay:.1f}×",
            yes_no(vs_assay >= GOAL_VS_ASSAY),
        ),
        (
            f"our verify within {GOAL_VS_LIMIT:.0f}× of the read + hash limit",
            f"{vs_limit:.1f}×",
            yes_no(vs_limit <= GOAL_VS_LIMIT),
        ),
        (
            f"whole process (`rce-verify`) ≥ {GOAL_CLI_VS_ASSAY:.0f}× faster than assay's, "
            "wall (CPU)",
            f"{vs_cli:.1f}× ({vs_cli_cpu:.1f}×)",
            yes_no(vs_cli >= GOAL_CLI_VS_ASSAY),
        ),
    ]
    return (
        "## Proof packs (`benchmarks/bench_packs.py`)\n\n"
        "Measured on:\n\n"
        f"{machine}\n"
        f"One sealed, completed job in SQLite: {r['steps']:,} tool steps and one pure step "
        f"({r['events']:,} events); its pack has {r['files']:,} files, "
        f"{r['bytes'] / 1e6:.1f} MB. Median of {reps} runs.\n\n"
        + markdown_table(["measurement", "time"], rows, "lr")
        + "\n\n"
        + markdown_table(["goal", "measured", "met"], goals, "lrl")
        + "\n\n### Where the `affidavit rce-verify` process spends its CPU\n\n"
        "Each import measured alone, as a process of its own (median CPU seconds; the imports "
        "overlap, so the rows do not add up to the whole):\n\n"
        + markdown_table(["process", "CPU s"], startup, "lr")
        + "\n\nPhase 5 (our extension) re-verifies the job's whole event log, ledger and seal "
        "from `events.ndjson`; assay checks only its SHA-256 (the manifest lists it).\n"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10_000, help="tool steps (default 10000)")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    p.add_argument("--no-write", action="store_true", help="do not update docs/PERFORMANCE.md")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    machine = describe_machine(None)
    byte_compile_affidavit()  # the processes load compiled files, as an installed package does
    result = run(args.steps, args.reps)
    text = markdown(result, machine.markdown(), args.reps)
    console.print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
