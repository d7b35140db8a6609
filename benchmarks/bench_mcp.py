"""Benchmark what affidavit adds to each MCP tool call, next to DBOS.

One MCP server (``benchmarks/_mcp_echo_server.py``, the SDK's MCPServer over stdio: a tool that
returns its argument) is called ``--calls`` times in a row, each call timed where the caller
makes it:

* ``bare``: the MCP client alone (affidavit's ``McpConnection``, no record): the call itself;
* ``affidavit``: an agent job whose every ``ctx.call("mcp:echo/echo", ...)`` is one ledgered
  tool step (``load_servers``): T1 durable, the call, T2 — SQLite and PostgreSQL;
* ``dbos``: a DBOS workflow whose every call is a ``@DBOS.step`` (checkpointed output) — SQLite
  and PostgreSQL system databases.

The **overhead** of a call is its time minus the bare call's (p50 and p95 separately). Each
engine runs in a subprocess of its own (fresh interpreter; DBOS's process-wide state and
affidavit's registry do not meet); a warm-up job/workflow goes first.

Usage (from the repository root)::

    python benchmarks/bench_mcp.py                     # both backends, writes the doc
    python benchmarks/bench_mcp.py --calls 50 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import (
    describe_machine,
    markdown_table,
    pg_fresh_database,
    pg_server_version,
    write_section,
)

SECTION = "bench_mcp"
DEFAULT_PG_URL = "postgresql://root@127.0.0.1:5432/test"
SERVER = Path(__file__).with_name("_mcp_echo_server.py")

CHILD = """\
import json, sys, time
engine, url, calls, server, tmp = sys.argv[1:6]
calls = int(calls)
config = {"servers": {"echo": {"command": [sys.executable, server]}}}
out = []

if engine == "bare":
    from affidavit.integrations.mcp import McpConnection, read_servers_file
    conn = McpConnection("echo", read_servers_file(config).servers["echo"])
    for i in range(20):
        conn.call("echo", {"i": i}, {})
    for i in range(calls):
        t = time.perf_counter()
        conn.call("echo", {"i": i}, {})
        out.append((time.perf_counter() - t) * 1000)
elif engine == "affidavit":
    from affidavit import AgentContext, Runtime, ToolRegistry, agent
    from affidavit.integrations.mcp import load_servers
    reg = ToolRegistry()
    load_servers(config, registry=reg)
    times = []

    @agent("bench_mcp_agent", version="1")
    def run(ctx: AgentContext, n: int) -> int:
        for i in range(n):
            t = time.perf_counter()
            ctx.call("mcp:echo/echo", i=i)
            times.append((time.perf_counter() - t) * 1000)
        return n

    reg.add_agent(run)
    with Runtime(url, tools=reg, signing_key=tmp + "/key") as rt:
        rt.run_job(rt.submit(run, {"n": 20}).job_id)  # warm-up
        times.clear()
        job = rt.run_job(rt.submit(run, {"n": calls}).job_id)
        assert job.status == "completed", job.error
    out = times
else:
    from dbos import DBOS
    from affidavit.integrations.mcp import McpConnection, read_servers_file
    conn = McpConnection("echo", read_servers_file(config).servers["echo"])
    DBOS(config={"name": "bench-mcp", "system_database_url": url, "log_level": "WARNING"})
    times = []

    @DBOS.step()
    def echo(i):
        return conn.call("echo", {"i": i}, {}).structured_content

    @DBOS.workflow()
    def run(n):
        for i in range(n):
            t = time.perf_counter()
            echo(i)
            times.append((time.perf_counter() - t) * 1000)
        return n

    DBOS.launch()
    run(20)
    times.clear()
    run(calls)
    out = times
    DBOS.destroy()
    conn.close()
print(json.dumps(out))
"""


def _child(engine: str, url: str, calls: int, tmp: Path) -> list[float]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, engine, url, str(calls), str(SERVER), str(tmp)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} child exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    times: list[float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return times


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--no-pg", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    ns = parser.parse_args()

    rows: list[tuple[str, str, list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp_name:
        tmp = Path(tmp_name)
        print("bare MCP calls …", flush=True)
        bare = _child("bare", "", ns.calls, tmp)
        rows.append(("bare MCP client", "—", bare))
        backends = [("SQLite", "sqlite")] + ([] if ns.no_pg else [("PostgreSQL", "pg")])
        for label, kind in backends:
            for engine in ("affidavit", "dbos"):
                print(f"{engine} on {label} …", flush=True)
                if kind == "sqlite":
                    times = _child(engine, f"sqlite:///{tmp / f'{engine}.db'}", ns.calls, tmp)
                else:
                    with pg_fresh_database(ns.pg_url, "bench_mcp") as url:
                        times = _child(engine, url, ns.calls, tmp)
                rows.append((engine, label, times))

    b50, b95 = _pct(bare, 50), _pct(bare, 95)
    table_rows = []
    for engine, label, times in rows:
        p50, p95 = _pct(times, 50), _pct(times, 95)
        over = engine != "bare MCP client"
        table_rows.append(
            (
                engine,
                label,
                f"{p50:.2f}",
                f"{p95:.2f}",
                f"{p50 - b50:+.2f}" if over else "—",
                f"{p95 - b95:+.2f}" if over else "—",
            )
        )
    table = markdown_table(
        ("engine", "database", "call p50 ms", "call p95 ms", "overhead p50 ms", "overhead p95 ms"),
        table_rows,
        "llrrrr",
    )
    pg_version = None if ns.no_pg else pg_server_version(ns.pg_url)
    body = (
        "## MCP tool calls through the ledger (bench_mcp)\n\n"
        f"{describe_machine(pg_version).markdown()}"
        f"- {ns.calls} calls in a row to one MCP server over stdio (the SDK's MCPServer, a tool "
        "returning its argument), each timed where the caller makes it; after a warm-up of 20.\n"
        "- affidavit: an agent job, each call one ledgered tool step (T1 durable, the call, T2); "
        "DBOS: a workflow, each call one `@DBOS.step`. Overhead = the call's time minus the bare "
        "MCP client's (same percentile). The machine is shared (2 cores, other work running): "
        "compare rows of one run only.\n\n"
        f"{table}\n"
    )
    print(body)
    if not ns.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
