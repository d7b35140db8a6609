"""Benchmark what affidavit adds to each call of a Pydantic AI agent, next to DBOS.

One agent (Pydantic AI's ``FunctionModel`` following a script: no network) makes ``--calls``
tool calls, one per model turn, then answers: ``calls`` tool calls and ``calls + 1`` model
requests per run. A timing capability on the agent (Pydantic AI's public
``wrap_model_request`` / ``wrap_tool_execute`` hooks, outside any durable wrapper) measures each
call from the agent graph's side; the scripted model and the tool measure their own work. The
**overhead** of one call is the first minus the second: what stands between the agent and the
work (the durable step's records, its commits, the thread hop), per call kind, p50 and p95.

Engines, each in a subprocess of its own (a fresh interpreter, so DBOS's process-wide state and
affidavit's registry do not meet), in one run:

* ``plain``: the agent run by Pydantic AI alone (no durability: its own overhead);
* ``affidavit``: the agent with ``AffidavitDurability``, run as affidavit jobs
  (``Runtime.submit`` + ``run_job``), SQLite and PostgreSQL: each model request a recorded pure
  step, each tool call a ledgered tool step; ``affidavit-wrapper`` the same through the
  deprecated ``AffidavitAgent``;
* ``dbos``: the same agent with Pydantic AI's ``DBOSDurability``, run inside a DBOS workflow,
  SQLite and PostgreSQL system databases: each model request a DBOS step; function tools run
  inline in the workflow (DBOS does not checkpoint them), so its tool-call overhead is that of
  an unrecorded call; ``dbos-wrapper`` the same through the deprecated ``DBOSAgent``.

Usage (from the repository root)::

    python benchmarks/bench_integrations.py                 # both backends, writes the doc
    python benchmarks/bench_integrations.py --runs 5 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import (
    cpu_ticks,
    describe_machine,
    markdown_table,
    pg_conninfo,
    pg_server_version,
    steal_share,
    steal_text,
    write_section,
)

SECTION = "bench_integrations"
DEFAULT_PG_URL = "postgresql://root@127.0.0.1:5432/test"
WARMUP_RUNS = 2
#: the durable configurations, each on every backend: the capabilities, then the wrappers
ENGINES = ("affidavit", "dbos", "affidavit-wrapper", "dbos-wrapper")


# --- the measured agent (built in each child process) ------------------------------------------


def build_agent(calls: int, samples: dict[str, list[float]], durability: Any = None) -> Any:
    """The agent: ``calls`` turns each asking for one ``noop`` call, then a final answer. Each
    model request and tool call appends (outer − inner) seconds to ``samples``. With
    ``durability`` (a durability capability), the agent has it besides the timer (which wraps
    it: durability capabilities are innermost)."""
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    inner: dict[str, float] = {}

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        t0 = time.perf_counter()
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn < calls:
            part: Any = ToolCallPart("noop", {"i": turn}, tool_call_id=f"c{turn}")
        else:
            part = TextPart("done")
        inner["model"] = time.perf_counter() - t0
        return ModelResponse(parts=[part])

    class Timer(AbstractCapability[Any]):
        async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
            t0 = time.perf_counter()
            inner["model"] = 0.0
            out = await handler(request_context)
            samples["model"].append(time.perf_counter() - t0 - inner["model"])
            return out

        async def wrap_tool_execute(
            self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any
        ) -> Any:
            t0 = time.perf_counter()
            inner["tool"] = 0.0
            out = await handler(args)
            samples["tool"].append(time.perf_counter() - t0 - inner["tool"])
            return out

    capabilities: list[Any] = [Timer()] if durability is None else [Timer(), durability]
    agent = Agent(FunctionModel(script), name="bench_agent", capabilities=capabilities)

    @agent.tool_plain
    def noop(i: int) -> int:
        t0 = time.perf_counter()
        inner["tool"] = time.perf_counter() - t0
        return i

    return agent


def child(engine: str, backend: str, url: str, runs: int, calls: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"model": [], "tool": []}
    if engine == "affidavit":  # the capability
        from affidavit import Runtime, ToolRegistry
        from affidavit.integrations.pydantic_ai import AffidavitDurability

        durability = AffidavitDurability(version="1")
        build_agent(calls, samples, durability)
        with Runtime(url, tools=ToolRegistry(durability.registrations)) as rt:
            for r in range(WARMUP_RUNS + runs):
                if r == WARMUP_RUNS:
                    samples["model"].clear(), samples["tool"].clear()
                job = rt.submit("bench_agent", {"prompt": "go"})
                done = rt.run_job(job.job_id)
                assert done.status == "completed", done.error
        return samples
    if engine == "dbos":  # the capability, its run inside a workflow of ours
        from dbos import DBOS
        from pydantic_ai.durable_exec.dbos import DBOSDurability

        DBOS(config={"name": "bench-pydantic-ai", "system_database_url": url,
                     "log_level": "WARNING"})  # fmt: skip
        agent = build_agent(calls, samples, DBOSDurability())

        @DBOS.workflow(name="bench_agent_run")
        async def run_agent() -> str:
            return str((await agent.run("go")).output)

        DBOS.launch()
        try:
            for r in range(WARMUP_RUNS + runs):
                if r == WARMUP_RUNS:
                    samples["model"].clear(), samples["tool"].clear()
                assert asyncio.run(run_agent()) == "done"
        finally:
            DBOS.destroy()
        return samples
    agent = build_agent(calls, samples)
    if engine == "plain":
        for r in range(WARMUP_RUNS + runs):
            if r == WARMUP_RUNS:
                samples["model"].clear(), samples["tool"].clear()
            assert agent.run_sync("go").output == "done"
    elif engine == "affidavit-wrapper":
        import warnings

        from affidavit import Runtime, ToolRegistry
        from affidavit.integrations.pydantic_ai import AffidavitAgent

        warnings.simplefilter("ignore")  # AffidavitAgent is deprecated for the capability
        wrapper = AffidavitAgent(agent, name="bench_agent", version="1")
        with Runtime(url, tools=ToolRegistry(wrapper.registrations)) as rt:
            for r in range(WARMUP_RUNS + runs):
                if r == WARMUP_RUNS:
                    samples["model"].clear(), samples["tool"].clear()
                job = rt.submit("bench_agent", {"prompt": "go"})
                done = rt.run_job(job.job_id)
                assert done.status == "completed", done.error
    elif engine == "dbos-wrapper":
        import warnings

        from dbos import DBOS

        warnings.simplefilter("ignore")  # DBOSAgent is deprecated in favour of a capability
        from pydantic_ai.durable_exec.dbos import DBOSAgent

        DBOS(config={"name": "bench-pydantic-ai", "system_database_url": url,
                     "log_level": "WARNING"})  # fmt: skip
        durable = DBOSAgent(agent, name="bench_agent")
        DBOS.launch()
        try:
            for r in range(WARMUP_RUNS + runs):
                if r == WARMUP_RUNS:
                    samples["model"].clear(), samples["tool"].clear()
                assert asyncio.run(durable.run("go")).output == "done"
        finally:
            DBOS.destroy()
    else:
        raise SystemExit(f"unknown engine {engine!r}")
    return samples


# --- the parent: one subprocess per configuration, then the report ------------------------------


def run_child(engine: str, backend: str, url: str, runs: int, calls: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", engine, backend, url, str(runs), str(calls)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{engine}/{backend} failed:\n{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="agent runs per configuration")
    parser.add_argument("--calls", type=int, default=10, help="tool calls per run")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        engine, backend, url, runs, calls = ns.child
        print(json.dumps(child(engine, backend, url, int(runs), int(calls))))
        return

    backends = ["sqlite", "postgresql"] if ns.backend == "both" else [ns.backend]
    pg_version = pg_server_version(ns.pg_url) if "postgresql" in backends else None
    machine = describe_machine(pg_version)
    ticks = cpu_ticks()
    results: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results[("plain", "-")] = run_child("plain", "-", "-", ns.runs, ns.calls)
        for backend in backends:
            for engine in ENGINES:
                url, cleanup = _database(engine, backend, Path(tmp), ns.pg_url)
                try:
                    results[(engine, backend)] = run_child(engine, backend, url, ns.runs, ns.calls)
                finally:
                    cleanup()
    steal = steal_share(ticks, cpu_ticks())

    labels = {
        "plain": "Pydantic AI alone",
        "affidavit": "AffidavitDurability",
        "affidavit-wrapper": "AffidavitAgent (deprecated)",
        "dbos": "DBOSDurability",
        "dbos-wrapper": "DBOSAgent (deprecated)",
    }
    rows = []
    for (engine, backend), samples in results.items():
        row = [labels[engine], {"-": "—", "sqlite": "SQLite", "postgresql": "PostgreSQL"}[backend]]
        for kind in ("model", "tool"):
            row += [ms(pct(samples[kind], 0.5)), ms(pct(samples[kind], 0.95))]
        rows.append(row)
    table = markdown_table(
        ["engine", "database", "model p50 ms", "model p95 ms", "tool p50 ms", "tool p95 ms"],
        rows,
        "llrrrr",
    )
    n_model, n_tool = ns.runs * (ns.calls + 1), ns.runs * ns.calls
    body = (
        "## Pydantic AI agents: per-call overhead (bench_integrations)\n\n"
        f"{machine.markdown()}\n"
        f"A shared machine (other work ran meanwhile): {steal_text(steal)}.\n\n"
        f"{ns.runs} agent runs per configuration (after {WARMUP_RUNS} warm-up runs), each "
        f"{ns.calls} tool calls and {ns.calls + 1} model requests: {n_model} model requests "
        f"and {n_tool} tool calls measured per row. Overhead of one call = the time the agent "
        "graph waits for it (Pydantic AI's `wrap_model_request` / `wrap_tool_execute` hooks) "
        "minus the time the scripted model or the tool itself takes.\n\n"
        "### Overhead per call\n\n"
        f"{table}\n"
        "AffidavitDurability (and the AffidavitAgent wrapper over it) records every model "
        "request as a pure step (its response in the log) and every tool call as a tool step "
        "through the ledger (T1 durable before the tool runs, T2 after). DBOSDurability and "
        "DBOSAgent record each model request as a DBOS step; their function tools run inline "
        "in the workflow, unrecorded, so their tool rows are the cost of an unrecorded call, "
        "not of a durable one.\n"
    )
    print(body)
    if not ns.no_write:
        write_section(SECTION, body)


def _database(engine: str, backend: str, tmp: Path, pg_url: str) -> tuple[str, Any]:
    """A fresh database for one configuration and how to drop it."""
    if backend == "sqlite":
        return f"sqlite:///{tmp / f'{engine}-{uuid.uuid4().hex[:8]}.db'}", lambda: None
    import psycopg

    base = pg_conninfo(pg_url)
    if engine.startswith("affidavit"):
        schema = f"bench_pydai_{uuid.uuid4().hex[:12]}"

        def drop_schema() -> None:
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

        sep = "&" if "?" in pg_url else "?"
        return f"{pg_url}{sep}schema={schema}", drop_schema
    name = f"bench_pydai_dbos_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop_database() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return pg_url.rsplit("/", 1)[0] + f"/{name}", drop_database


if __name__ == "__main__":
    main()
