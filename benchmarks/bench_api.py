"""HTTP API throughput and latency under a bounded loopback load.

Measured in one run: a bare FastAPI app whose one endpoint returns a constant (the baseline:
what uvicorn + FastAPI + the client cost on this machine), and the affidavit API reading a job
of about 1,000 events — ``GET /api/jobs/{id}`` (authenticated, namespace-checked), its trace and
its verification and its proof pack, each computed for every request (``fresh=1``) and served
from the server's cache of sealed jobs — on SQLite and PostgreSQL. Each server runs in a
subprocess of its own; the load comes from ``--clients`` threads with keep-alive connections,
each sending requests back to back.

    python -m benchmarks.bench_api [--requests 1500] [--clients 8] [--backend all]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
import psycopg
from rich.console import Console

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.faces.auth import create_api_key
from affidavit.store import open_store
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

SECTION = "bench_api"
PG_URL = os.environ.get("AFFIDAVIT_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")
TOOL_STEPS = 200  # 5 events per tool step + 3: a job of 1,003 events
console = Console(highlight=False)

SERVER = """
import sys, uvicorn
from fastapi import FastAPI
kind, port, url = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "bare":
    app = FastAPI()

    @app.get("/constant")
    def constant() -> dict:
        return {"ok": True}
else:
    from affidavit.api.app import create_app
    from affidavit.store import open_store
    app = create_app(open_store(url), rate_limit=None)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
"""


@dataclass(frozen=True)
class Result:
    backend: str
    name: str
    requests: int
    seconds: float
    p50_ms: float
    p95_ms: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(kind: str, url: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, kind, str(port), url])
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # (a loaded machine starts a server slowly)
        while True:
            try:
                httpx.get(f"{base}/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {kind} server did not start") from None
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def load(
    base: str, path: str, headers: dict[str, str], requests: int, clients: int
) -> tuple[float, list[float]]:
    """Send ``requests`` GETs from ``clients`` threads; (elapsed seconds, latencies in ms)."""
    per = requests // clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=30) as c:
            c.get(path).raise_for_status()  # warm the connection
            start.wait()
            for _ in range(per):
                t0 = time.perf_counter()
                r = c.get(path)
                latencies[i].append((time.perf_counter() - t0) * 1000)
                if r.status_code != 200:
                    raise RuntimeError(f"{path}: {r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, [x for xs in latencies for x in xs]


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def make_job(url: str) -> tuple[str, str]:
    """A completed job of ~1,000 events and an observer key; (job id, key)."""

    def step(ctx: ToolContext, i: int) -> dict[str, Any]:
        return {"i": i}

    nodes = [
        {"id": f"s{i}", "type": "tool", "tool": "step", "args": {"i": i},
         **({"depends_on": [f"s{i - 1}"]} if i else {})}
        for i in range(TOOL_STEPS)
    ]  # fmt: skip
    with Runtime(url, tools=ToolRegistry([Tool("step", step, "tool")])) as rt:
        job_id = rt.submit({"name": "bench-api", "nodes": nodes}, {}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        _, key = create_api_key(rt.store, agent_id="bench", role="observer", namespace="default")
    return job_id, key


@contextmanager
def database(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with TemporaryDirectory() as d:
            yield f"sqlite:///{Path(d) / 'bench.db'}"
        return
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def measure(name: str, backend: str, base: str, path: str, headers: dict[str, str],
            requests: int, clients: int) -> Result:  # fmt: skip
    seconds, lat = load(base, path, headers, requests, clients)
    result = Result(backend, name, len(lat), seconds, median(lat), p95(lat))
    console.print(
        f"{backend:10} {name:34} {result.rate:8,.0f} req/s  p50 {result.p50_ms:6.1f} ms  "
        f"p95 {result.p95_ms:6.1f} ms"
    )
    return result


# (name, path suffix) of each answer about a sealed job measured both ways: computed for every
# request (``fresh=1``: what every request cost before answers were kept) and served kept
PAIRED = [("trace", "/trace"), ("verify", "/verify"), ("pack", "/pack")]
COLD_SHARE = {"trace": 1, "verify": 1, "pack": 10}  # cold packs are slow: a tenth of the requests
GOAL = 10.0  # cached ÷ cold for the trace and the verification


def run(backends: Sequence[str], requests: int, clients: int) -> list[Result]:
    results: list[Result] = []
    with server("bare", "-") as bare:
        results.append(measure("bare FastAPI constant", "-", bare, "/constant", {}, requests,
                               clients))  # fmt: skip
    for backend in backends:
        with database(backend) as url:
            job_id, key = make_job(url)
            events = open_store(url).get_job(job_id).version
            headers = {"Authorization": f"Bearer {key}"}
            with server("affidavit", url) as base:
                one = f"GET /api/jobs/{{id}} ({events} events)"
                results.append(measure(one, backend, base, f"/api/jobs/{job_id}", headers,
                                       requests, clients))  # fmt: skip
                for name, suffix in PAIRED:
                    path = f"/api/jobs/{job_id}{suffix}"
                    cold = max(clients, requests // COLD_SHARE[name])
                    results.append(measure(f"{name} cold (fresh=1)", backend, base,
                                           f"{path}?fresh=1", headers, cold, clients))  # fmt: skip
                    results.append(measure(f"{name} cached", backend, base, path, headers,
                                           requests, clients))  # fmt: skip
    return results


def pairs(results: list[Result]) -> list[tuple[str, str, Result, Result]]:
    """(backend, answer, cold, cached) of each answer measured both ways."""
    by = {(r.backend, r.name): r for r in results}
    return [
        (r.backend, name, r, by[(r.backend, f"{name} cached")])
        for r in results
        for name, _ in PAIRED
        if r.name == f"{name} cold (fresh=1)"
    ]


def markdown(machine: Any, results: list[Result], requests: int, clients: int, runtime: float,
             steal: float | None) -> str:  # fmt: skip
    bare = results[0]
    goal_rows = []
    for backend, name, cold, cached in pairs(results):
        ratio = cached.rate / cold.rate
        goal, met = ("≥ 10×", "yes" if ratio >= GOAL else "no") if name != "pack" else ("—", "—")
        goal_rows.append([backend, name, f"{cold.rate:,.0f}", f"{cached.rate:,.0f}",
                          f"{ratio:.1f}×", goal, met])  # fmt: skip
    rows = [
        [r.backend, r.name, f"{r.rate:,.0f}", f"{r.p50_ms:.1f}", f"{r.p95_ms:.1f}",
         f"{r.rate / bare.rate:.2f}×"]
        for r in results
    ]  # fmt: skip
    return (
        "## HTTP API under loopback load (`benchmarks/bench_api.py`)\n\n"
        "Measured on:\n\n"
        f"{machine.markdown()}"
        f"- Benchmark runtime: {runtime:.0f} s; {steal_text(steal)}\n\n"
        f"{clients} client threads (keep-alive `httpx` connections) send {requests:,} GET "
        "requests back to back to a uvicorn server in its own process on 127.0.0.1 (one worker). "
        "The baseline is a bare FastAPI app whose one endpoint returns a constant, served and "
        "loaded the same way in the same run. The affidavit API serves a completed (sealed) job "
        f"of {TOOL_STEPS} durable tool steps; every request is authenticated with an observer "
        "key (a key lookup and a SHA-256) and namespace-checked. Client and server share the "
        "machine's 2 cores, so the ratios say more than the absolute rates.\n\n"
        "A sealed job's trace, verification and pack are computed once per server and served "
        "again; each request still authenticates, checks the namespace and reads the seal. "
        "*cold* asks with `fresh=1`, which computes the answer for every request (what each "
        "request cost before answers were kept); *cached* is the same request without it. Cold "
        "packs are measured with a tenth of the requests.\n\n"
        "### Sealed jobs: cached ÷ cold\n\n"
        + markdown_table(
            ["Backend", "Answer", "cold req/s", "cached req/s", "cached ÷ cold", "goal", "met"],
            goal_rows,
            "llrrrll",
        )
        + "\n### Every endpoint\n\n"
        + markdown_table(
            ["Backend", "Endpoint", "Requests/s", "p50 ms", "p95 ms", "vs bare"],
            rows,
            "llrrrr",
        )
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "all"], default="all")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--output", type=Path, default=PERFORMANCE_MD)
    args = parser.parse_args(argv)
    backends = ["sqlite", "postgresql"] if args.backend == "all" else [args.backend]
    machine = describe_machine(pg_server_version(PG_URL) if "postgresql" in backends else None)
    started, ticks = time.perf_counter(), cpu_ticks()
    results = run(backends, args.requests, args.clients)
    runtime, steal = time.perf_counter() - started, steal_share(ticks, cpu_ticks())
    if not args.no_write:
        write_section(SECTION, markdown(machine, results, args.requests, args.clients, runtime,
                                        steal), args.output)  # fmt: skip
        console.print(f"Wrote the {SECTION} section of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
