"""Benchmark what affidavit adds to each call of an OpenAI Agents SDK run, next to DBOS.

One agent (a scripted ``agents.Model``: no network) makes ``--calls`` function tool calls, one
per model turn, then answers: ``calls`` tool calls and ``calls + 1`` model calls per run. Run
hooks (the SDK's public ``RunHooks.on_llm_start/on_llm_end`` and ``on_tool_start/on_tool_end``,
outside any durable wrapper) time each call from the run's side; the scripted model and the tool
time their own work. The **overhead** of one call is the first minus the second: what stands
between the SDK's loop and the work (the durable step's records, its commits, the thread hop),
per call kind, p50 and p95.

Engines, each in a subprocess of its own (a fresh interpreter, so DBOS's process-wide state and
affidavit's registry do not meet), in one run:

* ``plain``: ``agents.Runner.run`` alone (no durability: the SDK's own overhead);
* ``affidavit``: ``AffidavitRunner.run`` in an affidavit agent job (``Runtime.submit`` +
  ``run_job``), SQLite and PostgreSQL: each model call a recorded pure step, each tool call a
  tool step through the ledger (at most once);
* ``dbos``: ``dbos_openai_agents.DBOSRunner.run`` in a ``@DBOS.workflow``, the tool a
  ``@DBOS.step`` as its README asks, SQLite and PostgreSQL system databases: each model call and
  each tool call a DBOS step (recorded after it ran: at least once).

Usage (from the repository root)::

    python benchmarks/bench_integrations_openai.py                 # both backends, writes the doc
    python benchmarks/bench_integrations_openai.py --runs 5 --no-write   # smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import (
    cpu_ticks,
    describe_machine,
    markdown_table,
    pg_server_version,
    steal_share,
    steal_text,
    write_section,
)
from benchmarks.bench_integrations import DEFAULT_PG_URL, WARMUP_RUNS, _database, ms, pct

SECTION = "bench_integrations_openai"


# --- the measured agent (built in each child process) ------------------------------------------


def build(calls: int, samples: dict[str, list[float]], tool_wrap: Any = None) -> tuple[Any, Any]:
    """The agent (``calls`` turns each asking for one ``noop`` call, then an answer) and the run
    hooks that append (outer − inner) seconds per model call and tool call to ``samples``."""
    from agents import Agent, Model, ModelResponse, RunHooks, Usage, function_tool
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    inner: dict[str, float] = {}
    started: dict[str, float] = {}

    class Script(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            t0 = time.perf_counter()
            items = [] if isinstance(input, str) else input
            turn = sum(1 for i in items if _type(i) == "function_call")
            if turn < calls:
                out: Any = ResponseFunctionToolCall(
                    type="function_call", call_id=f"c{turn}", name="noop",
                    arguments=json.dumps({"i": turn}), id=f"fc{turn}",
                )  # fmt: skip
            else:
                text = ResponseOutputText(type="output_text", text="done", annotations=[])
                out = ResponseOutputMessage(
                    id="m", type="message", role="assistant", status="completed", content=[text]
                )
            inner["model"] = time.perf_counter() - t0
            return ModelResponse(output=[out], usage=Usage(), response_id=None)

        def stream_response(self, *a: Any, **k: Any) -> Any:  # pragma: no cover
            raise NotImplementedError

    class Timer(RunHooks[Any]):
        async def on_llm_start(self, *a: Any, **k: Any) -> None:
            inner["model"] = 0.0
            started["model"] = time.perf_counter()

        async def on_llm_end(self, *a: Any, **k: Any) -> None:
            samples["model"].append(time.perf_counter() - started["model"] - inner["model"])

        async def on_tool_start(self, *a: Any, **k: Any) -> None:
            inner["tool"] = 0.0
            started["tool"] = time.perf_counter()

        async def on_tool_end(self, *a: Any, **k: Any) -> None:
            samples["tool"].append(time.perf_counter() - started["tool"] - inner["tool"])

    def noop(i: int) -> int:
        """Return ``i``."""
        t0 = time.perf_counter()
        inner["tool"] = time.perf_counter() - t0
        return i

    fn = tool_wrap(noop) if tool_wrap is not None else noop
    agent = Agent(
        name="bench_agent", model=Script(), tools=[function_tool(fn, name_override="noop")]
    )
    return agent, Timer()


def _type(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


def child(engine: str, backend: str, url: str, runs: int, calls: int) -> dict[str, Any]:
    from agents import RunConfig, Runner

    samples: dict[str, list[float]] = {"model": [], "tool": []}
    config = RunConfig(tracing_disabled=True)

    def reset(r: int) -> None:
        if r == WARMUP_RUNS:
            samples["model"].clear(), samples["tool"].clear()

    if engine == "plain":
        agent, hooks = build(calls, samples)
        for r in range(WARMUP_RUNS + runs):
            reset(r)
            result = asyncio.run(
                Runner.run(agent, "go", hooks=hooks, run_config=config, max_turns=calls + 2)
            )
            assert result.final_output == "done"
    elif engine == "affidavit":
        import affidavit
        from affidavit import Runtime, ToolRegistry
        from affidavit.integrations.openai_agents import STEPS, AffidavitRunner

        agent, hooks = build(calls, samples)

        @affidavit.agent("bench_oai", version="1")
        async def job(ctx: affidavit.AgentContext, prompt: str) -> Any:
            result = await AffidavitRunner.run(
                agent, prompt, hooks=hooks, run_config=config, max_turns=calls + 2
            )
            return result.final_output

        with Runtime(url, tools=ToolRegistry([*STEPS, job])) as rt:
            for r in range(WARMUP_RUNS + runs):
                reset(r)
                done = rt.run_job(rt.submit("bench_oai", {"prompt": "go"}).job_id)
                assert done.status == "completed" and done.output == "done", done.error
    elif engine == "dbos":
        from dbos import DBOS
        from dbos_openai_agents import DBOSRunner

        DBOS(config={"name": "bench-openai-agents", "system_database_url": url,
                     "log_level": "WARNING"})  # fmt: skip
        agent, hooks = build(calls, samples, tool_wrap=DBOS.step())

        @DBOS.workflow()
        async def workflow(prompt: str) -> Any:
            result = await DBOSRunner.run(
                agent, prompt, hooks=hooks, run_config=config, max_turns=calls + 2
            )
            return result.final_output

        DBOS.launch()
        try:
            for r in range(WARMUP_RUNS + runs):
                reset(r)
                assert asyncio.run(workflow("go")) == "done"
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
            for engine in ("affidavit", "dbos"):
                url, cleanup = _database(engine, backend, Path(tmp), ns.pg_url)
                try:
                    results[(engine, backend)] = run_child(engine, backend, url, ns.runs, ns.calls)
                finally:
                    cleanup()
    steal = steal_share(ticks, cpu_ticks())

    labels = {"plain": "Runner (SDK alone)", "affidavit": "AffidavitRunner", "dbos": "DBOSRunner"}
    rows, p50 = [], {}
    for (engine, backend), samples in results.items():
        row = [labels[engine], {"-": "—", "sqlite": "SQLite", "postgresql": "PostgreSQL"}[backend]]
        for kind in ("model", "tool"):
            row += [ms(pct(samples[kind], 0.5)), ms(pct(samples[kind], 0.95))]
            p50[(engine, backend, kind)] = pct(samples[kind], 0.5)
        rows.append(row)
    table = markdown_table(
        ["engine", "database", "model p50 ms", "model p95 ms", "tool p50 ms", "tool p95 ms"],
        rows,
        "llrrrr",
    )
    ratios = []
    for backend in backends:
        for kind in ("model", "tool"):
            ours, theirs = p50[("affidavit", backend, kind)], p50[("dbos", backend, kind)]
            ratio = f"{ours / theirs:.2f}×" if theirs > 0 else "—"
            ratios.append([backend, kind, ratio])
    ratio_table = markdown_table(["database", "call", "AffidavitRunner p50 ÷ DBOSRunner p50"],
                                 ratios, "llr")  # fmt: skip
    n_model, n_tool = ns.runs * (ns.calls + 1), ns.runs * ns.calls
    body = (
        "## OpenAI Agents SDK runs: per-call overhead (bench_integrations_openai)\n\n"
        f"{machine.markdown()}\n"
        f"A shared machine (other work ran meanwhile): {steal_text(steal)}.\n\n"
        f"{ns.runs} agent runs per configuration (after {WARMUP_RUNS} warm-up runs), each "
        f"{ns.calls} tool calls and {ns.calls + 1} model calls: {n_model} model calls and "
        f"{n_tool} tool calls measured per row. Overhead of one call = the time the SDK's loop "
        "waits for it (`RunHooks.on_llm_start`→`on_llm_end`, `on_tool_start`→`on_tool_end`) "
        "minus the time the scripted model or the tool itself takes.\n\n"
        "### Overhead per call\n\n"
        f"{table}\n"
        f"{ratio_table}\n"
        "AffidavitRunner records every model call as a pure step (its response in the log) and "
        "every tool call as a tool step through the ledger (T1 durable before the tool runs, T2 "
        "after: at most once). DBOSRunner records each model call and each `@DBOS.step` tool "
        "call as a DBOS step after it ran (a crash between the effect and that record repeats "
        "the effect: at least once).\n"
    )
    print(body)
    if not ns.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
