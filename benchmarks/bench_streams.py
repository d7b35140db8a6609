"""Live streams: the latency from ``ctx.emit`` in a running agent job to a reader of
``GET /api/jobs/{id}/stream`` (Server-Sent Events over loopback HTTP), p50 and p95.

Measured in one run, on SQLite and PostgreSQL: an agent job emits ``--values`` values
``--spacing`` seconds apart, each carrying the wall-clock time just before its ``ctx.emit``
(the emit's commit included in the latency); a reader on the API server (uvicorn in a process
of its own) notes when each value's event arrives. The baseline is one ``GET /api/jobs/{id}``
round trip on the same server: what the cheapest read of the job costs a reader that polls.

    python -m benchmarks.bench_streams [--values 200] [--spacing 0.05] [--backend all]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit import AgentContext, Runtime, ToolRegistry, agent
from affidavit.faces.auth import create_api_key
from benchmarks._report import (
    PERFORMANCE_MD,
    cpu_ticks,
    describe_machine,
    markdown_table,
    median,
    pg_server_version,
    steal_share,
    steal_text,
    write_section,
)
from benchmarks.bench_api import PG_URL, database, p95, server

SECTION = "bench_streams"
console = Console(highlight=False)


@agent("bench_streamer", version="1")
def streamer(ctx: AgentContext, values: int, spacing: float) -> int:
    for i in range(values):
        time.sleep(spacing)
        ctx.emit({"i": i, "t": time.time()})
    return values


@dataclass(frozen=True)
class Result:
    backend: str
    values: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    round_trip_ms: float


def measure(backend: str, url: str, values: int, spacing: float) -> Result:
    with Runtime(url, tools=ToolRegistry([streamer])) as rt:
        _, key = create_api_key(rt.store, agent_id="bench", role="observer", namespace="default")
        headers = {"Authorization": f"Bearer {key}"}
        job_id = rt.submit("bench_streamer", {"values": values, "spacing": spacing}).job_id
        with (
            server("affidavit", url) as base,
            httpx.Client(base_url=base, headers=headers, timeout=60) as client,
        ):
            round_trips = []
            for _ in range(100):
                t0 = time.perf_counter()
                client.get(f"/api/jobs/{job_id}").raise_for_status()
                round_trips.append((time.perf_counter() - t0) * 1000)
            latencies: list[float] = []
            reading = threading.Event()

            def read() -> None:
                with client.stream("GET", f"/api/jobs/{job_id}/stream") as r:
                    r.raise_for_status()
                    reading.set()
                    event = ""
                    for line in r.iter_lines():
                        if line.startswith("event: "):
                            event = line[7:]
                        elif line.startswith("data: ") and event == "stream_emitted":
                            arrived = time.time()
                            value: Any = json.loads(line[6:])["payload"]["value"]
                            latencies.append((arrived - value["t"]) * 1000)
                        elif line.startswith("data: ") and event == "end":
                            return

            reader = threading.Thread(target=read)
            reader.start()
            reading.wait(30)
            done = rt.run_job(job_id)
            reader.join(120)
            assert done.status == "completed", done.error
    assert len(latencies) == values, f"the reader saw {len(latencies)} of {values} values"
    result = Result(
        backend, values, median(latencies), p95(latencies), max(latencies), median(round_trips)
    )
    console.print(
        f"{backend:10} emit → SSE reader p50 {result.p50_ms:6.1f} ms  p95 {result.p95_ms:6.1f} ms"
        f"  max {result.max_ms:6.1f} ms   (GET /api/jobs/{{id}} p50 {result.round_trip_ms:.1f} ms)"
    )
    return result


def markdown(machine: Any, results: list[Result], spacing: float, runtime: float,
             steal: float | None) -> str:  # fmt: skip
    rows = [
        [r.backend, str(r.values), f"{r.p50_ms:.1f}", f"{r.p95_ms:.1f}", f"{r.max_ms:.1f}",
         f"{r.round_trip_ms:.1f}", f"{r.p50_ms / r.round_trip_ms:.1f}×"]
        for r in results
    ]  # fmt: skip
    return (
        "## Live streams: emit → Server-Sent Events reader (`benchmarks/bench_streams.py`)\n\n"
        "Measured on:\n\n"
        f"{machine.markdown()}"
        f"- Benchmark runtime: {runtime:.0f} s; {steal_text(steal)}\n\n"
        f"An agent job emits one value every {spacing * 1000:.0f} ms, each carrying the wall-"
        "clock time just before its `ctx.emit` (so the emit's own commit is in the latency); a "
        "reader of `GET /api/jobs/{id}/stream` on the API server (uvicorn, its own process, "
        "127.0.0.1) notes when each value's event arrives. The server follows the log by polling "
        "it: 20 ms apart while events come, backing off to 200 ms while the job is quiet. The "
        "baseline is one `GET /api/jobs/{id}` round trip on the same server (what the cheapest "
        "read costs a reader that polls instead). Reader, server and job share the 2 cores.\n\n"
        + markdown_table(
            ["Backend", "Values", "p50 ms", "p95 ms", "max ms", "GET job p50 ms", "p50 vs GET"],
            rows,
            "lrrrrrr",
        )
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=200)
    parser.add_argument("--spacing", type=float, default=0.05)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "all"], default="all")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--output", type=Path, default=PERFORMANCE_MD)
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "all" else [args.backend]
    machine = describe_machine(pg_server_version(PG_URL) if "postgresql" in backends else None)
    started, ticks = time.perf_counter(), cpu_ticks()
    results = []
    for backend in backends:
        with database(backend) as url:
            results.append(measure(backend, url, args.values, args.spacing))
    runtime, steal = time.perf_counter() - started, steal_share(ticks, cpu_ticks())
    if not args.no_write:
        write_section(SECTION, markdown(machine, results, args.spacing, runtime, steal),
                      args.output)  # fmt: skip
        console.print(f"Wrote the {SECTION} section of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
