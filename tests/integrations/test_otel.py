"""OpenTelemetry spans of jobs (the SDK's in-memory exporter), on both backends: a job span,
a span per step and an ``execute_tool`` span per tool call with the GenAI attributes, each
carrying the job id and the chain hash of the event that closed it; the ``traceparent`` of an
HTTP submit recorded with the job and followed by its spans; off unless ``OTEL_*`` says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from affidavit import (
    AgentContext,
    ConfigError,
    Runtime,
    Tool,
    ToolContext,
    ToolRegistry,
    agent,
    verify_job,
)
from affidavit.api.app import create_app
from affidavit.faces.auth import create_api_key
from affidavit.integrations.otel import enabled_by_env, instrument
from affidavit.store import open_store
from tests.api.conftest import Server
from tests.runtime.crash_tools import REGISTRY as CRASH_REGISTRY
from tests.runtime.crash_tools import charge_plan
from tests.runtime.helpers import ledger_rows, run_driver, wait_lease_expired

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
    return {"paid": amount, "key": ctx.external_key}


def _refuse(ctx: ToolContext) -> None:
    raise ValueError("no")


def _think(ctx: ToolContext, x: Any) -> dict[str, Any]:
    return {"thought": x}


TOOL_LIST = [
    Tool("otel_pay", _pay, "tool"),
    Tool("otel_refuse", _refuse, "tool"),
    Tool("otel_think", _think, "pure"),
]
TOOLS = ToolRegistry(TOOL_LIST)
PLAN = {
    "name": "otel-pay",
    "nodes": [
        {"id": "pay", "type": "tool", "tool": "otel_pay", "args": {"amount": "${input.amount}"}},
        {"id": "think", "type": "pure", "tool": "otel_think", "args": {"x": "${pay}"},
         "depends_on": ["pay"]},
    ],
}  # fmt: skip


def traced_runtime(url: str) -> tuple[Runtime, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = Runtime(url, tools=ToolRegistry(TOOL_LIST))  # its own: a test adds an agent
    instrument(rt, provider)
    return rt, exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named = {s.name: s for s in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


def test_job_step_and_tool_spans(store_url: str) -> None:
    rt, exporter = traced_runtime(store_url)
    with rt:
        job = rt.submit(PLAN, {"amount": 5}, traceparent=PARENT)
        assert rt.run_job(job.job_id).status == "completed"
        events = {e.version: e for e in rt.store.list_events(job.job_id)}
        [row] = ledger_rows(rt.store, job.job_id)
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {
        "affidavit.job otel-pay",
        "affidavit.step pay",
        "affidavit.step think",
        "execute_tool otel_pay",
    }
    job_span = spans["affidavit.job otel-pay"]
    call = spans["execute_tool otel_pay"]
    step = spans["affidavit.step pay"]
    # the job joins the submitter's trace; steps under the job, the call under its step
    assert format(job_span.context.trace_id, "032x") == TRACE_ID
    assert job_span.parent is not None and format(job_span.parent.span_id, "016x") == (
        "00f067aa0ba902b7"
    )
    assert {s.context.trace_id for s in spans.values()} == {job_span.context.trace_id}
    assert step.parent.span_id == job_span.context.span_id  # type: ignore[union-attr]
    assert call.parent.span_id == step.context.span_id  # type: ignore[union-attr]
    assert spans["affidavit.step think"].parent.span_id == job_span.context.span_id  # type: ignore[union-attr]
    # GenAI semantic conventions
    assert call.attributes["gen_ai.operation.name"] == "execute_tool"  # type: ignore[index]
    assert call.attributes["gen_ai.tool.name"] == "otel_pay"  # type: ignore[index]
    assert call.attributes["gen_ai.tool.call.id"] == row.step_id  # type: ignore[index]
    assert call.attributes["affidavit.idempotency_key"] == row.idempotency_key  # type: ignore[index]
    # every span joins the proof: the job id and the closing event's stored chain hash
    for span in spans.values():
        attrs = dict(span.attributes or {})
        assert attrs["affidavit.job.id"] == job.job_id
        closing = events[attrs["affidavit.event.version"]]
        assert attrs["affidavit.event.chain_hash"] == closing.chain_hash
    assert events[call.attributes["affidavit.event.version"]].type == (  # type: ignore[index]
        "tool_invocation_finished"
    )
    assert events[job_span.attributes["affidavit.event.version"]].type == "job_completed"  # type: ignore[index]
    assert job_span.attributes["affidavit.job.status"] == "completed"  # type: ignore[index]
    # the recorded times: the step span ends after its start, inside the job span
    assert job_span.start_time <= step.start_time <= step.end_time <= job_span.end_time  # type: ignore[operator]


def test_a_failed_tool_call_is_an_error_span_and_no_parent_is_a_new_trace(
    store_url: str,
) -> None:
    plan = {"name": "otel-refuse", "nodes": [{"id": "r", "type": "tool", "tool": "otel_refuse"}]}
    rt, exporter = traced_runtime(store_url)
    with rt:
        assert rt.run_job(rt.submit(plan, {}).job_id).status == "failed"
    spans = by_name(exporter.get_finished_spans())
    assert spans["execute_tool otel_refuse"].status.status_code == StatusCode.ERROR
    job_span = spans["affidavit.job otel-refuse"]
    assert job_span.status.status_code == StatusCode.ERROR
    assert job_span.parent is None


@agent("otel_payer", version="1")
def payer(ctx: AgentContext, amount: int) -> dict[str, Any]:
    paid = ctx.call("otel_pay", amount=amount)
    return {"thought": ctx.call("otel_think", x=paid)}


def test_an_agent_job_is_invoke_agent(store_url: str) -> None:
    rt, exporter = traced_runtime(store_url)
    with rt:
        rt.tools.add_agent(payer)
        job = rt.submit(payer, {"amount": 2}, traceparent=PARENT)
        assert rt.run_job(job.job_id).status == "completed"
        [row] = ledger_rows(rt.store, job.job_id)
    spans = by_name(exporter.get_finished_spans())
    job_span = spans["invoke_agent otel_payer"]
    assert job_span.attributes["gen_ai.operation.name"] == "invoke_agent"  # type: ignore[index]
    assert job_span.attributes["gen_ai.agent.name"] == "otel_payer"  # type: ignore[index]
    assert format(job_span.context.trace_id, "032x") == TRACE_ID
    call = spans["execute_tool otel_pay"]
    assert call.attributes["gen_ai.tool.call.id"] == row.step_id  # type: ignore[index]
    # steps are named by their node id: #0, #1 in program order
    assert {"affidavit.step #0", "affidavit.step #1"} <= set(spans)
    assert call.parent.span_id == spans["affidavit.step #0"].context.span_id  # type: ignore[union-attr]


def test_a_waiting_jobs_finished_steps_are_visible_and_emitted_once(store_url: str) -> None:
    plan = {
        "name": "otel-wait",
        "nodes": [
            {"id": "pay", "type": "tool", "tool": "otel_pay", "args": {"amount": 1}},
            {"id": "ok", "type": "approval", "depends_on": ["pay"]},
            {"id": "think", "type": "pure", "tool": "otel_think", "args": {"x": 1},
             "depends_on": ["ok"]},
        ],
    }  # fmt: skip
    rt, exporter = traced_runtime(store_url)
    with rt:
        job = rt.submit(plan, {})
        assert rt.run_job(job.job_id).status == "waiting"
        # the finished step and its call are exported while the job waits; no job span yet
        waiting = by_name(exporter.get_finished_spans())
        assert set(waiting) == {"affidavit.step pay", "execute_tool otel_pay"}
        rt.signal(job.job_id, f"{job.job_id}:ok", {"approved": True}, approver="ann")
        assert rt.run_job(job.job_id).status == "completed"
    spans = by_name(exporter.get_finished_spans())  # each span once
    assert set(spans) == {
        "affidavit.job otel-wait",
        "affidavit.step pay",
        "affidavit.step ok",
        "affidavit.step think",
        "execute_tool otel_pay",
    }
    # the spans of the first run are children of the job span emitted at the end
    job_span = spans["affidavit.job otel-wait"]
    assert waiting["affidavit.step pay"].parent.span_id == job_span.context.span_id  # type: ignore[union-attr]
    assert waiting["affidavit.step pay"].context.trace_id == job_span.context.trace_id
    assert not any(
        s.attributes["affidavit.step.recovered"] for s in spans.values() if s is not job_span
    )  # type: ignore[index]


def test_http_traceparent_is_recorded_with_the_job(store_url: str) -> None:
    store = open_store(store_url)
    _, key = create_api_key(store, agent_id="bot", role="agent", namespace="default")
    auth = {"Authorization": f"Bearer {key}"}
    with Server(create_app(store, tools=TOOLS)) as url, httpx.Client(base_url=url) as c:
        sent = c.post(
            "/api/jobs",
            json={"plan": PLAN, "input": {"amount": 1}},
            headers={**auth, "traceparent": PARENT},
        )
        malformed = c.post(
            "/api/jobs",
            json={"plan": PLAN, "input": {"amount": 2}},
            headers={**auth, "traceparent": "00-zz-nope-01"},
        )
    assert sent.status_code == malformed.status_code == 201
    first = store.list_events(sent.json()["job_id"], limit=1)[0].payload
    assert first["traceparent"] == PARENT
    # a malformed header is ignored (W3C Trace Context), the job is submitted without it
    assert "traceparent" not in store.list_events(malformed.json()["job_id"], limit=1)[0].payload
    rt, exporter = traced_runtime(store_url)
    with rt:
        rt.run_job(sent.json()["job_id"])
    job_span = by_name(exporter.get_finished_spans())["affidavit.job otel-pay"]
    assert format(job_span.context.trace_id, "032x") == TRACE_ID
    store.close()


def test_a_malformed_traceparent_is_refused_from_python(store_url: str) -> None:
    with Runtime(store_url, tools=TOOLS) as rt:
        with pytest.raises(ConfigError, match="malformed traceparent"):
            rt.submit(PLAN, {"amount": 1}, traceparent=f"00-{'0' * 32}-00f067aa0ba902b7-01")
        assert rt.store.list_jobs() == []


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_enabled_by_env(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], enabled: bool
) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert enabled_by_env() is enabled


TOOLS_FILE = """
from affidavit import tool

@tool("otel_cli_pay")
def pay(ctx, amount):
    return {"paid": amount}
"""
CLI_PLAN = {"name": "otel-cli", "nodes": [
    {"id": "pay", "type": "tool", "tool": "otel_cli_pay", "args": {"amount": 3}}]}  # fmt: skip


def _cli_run(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "otel_tools.py").write_text(TOOLS_FILE)
    (tmp_path / "plan.json").write_text(json.dumps(CLI_PLAN))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "affidavit", "run", str(tmp_path / "plan.json"), "--tools",
         str(tmp_path / "otel_tools.py"), "--db", f"sqlite:///{tmp_path / 'a.db'}", "--json"],
        env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_cli_exports_spans_when_otel_env_says_so(tmp_path: Path) -> None:
    proc = _cli_run(tmp_path, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "shop"})
    assert proc.returncode == 0, proc.stderr
    # the spans go to stderr: stdout is the command's output, JSON alone
    assert json.loads(proc.stdout)["status"] == "completed"
    assert '"name": "execute_tool otel_cli_pay"' in proc.stderr
    assert '"gen_ai.tool.name": "otel_cli_pay"' in proc.stderr
    assert '"service.name": "shop"' in proc.stderr


def test_cli_refuses_an_exporter_that_is_not_installed(tmp_path: Path) -> None:
    proc = _cli_run(tmp_path, {"OTEL_TRACES_EXPORTER": "nonesuch"})
    assert proc.returncode == 3
    assert "'nonesuch', which is not installed" in proc.stdout + proc.stderr


def test_off_by_default_opentelemetry_is_not_imported(tmp_path: Path) -> None:
    """Without OTEL_*, running a job never imports OpenTelemetry."""
    (tmp_path / "otel_tools.py").write_text(TOOLS_FILE)
    script = (
        "import sys, json\n"
        "from affidavit.cli.main import main\n"
        "try:\n"
        f"    main(['run', {str(tmp_path / 'plan.json')!r}, '--tools', "
        f"{str(tmp_path / 'otel_tools.py')!r}, '--db', 'sqlite:///{tmp_path / 'b.db'}', "
        "'--json'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "loaded = any(m.startswith('opentelemetry') for m in sys.modules)\n"
        "print('IMPORTED' if loaded else 'CLEAN')\n"
    )
    (tmp_path / "plan.json").write_text(json.dumps(CLI_PLAN))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=clean, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("CLEAN")


def test_a_recovered_job_has_the_catch_up_call_and_no_dangling_step(
    store_url: str, tmp_path: Path
) -> None:
    """A worker killed after the tool acted; the recovering runtime reconciles the call. The
    dead attempt's call span is closed by the catch-up finish; every step span is closed."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with Runtime(store_url, tools=CRASH_REGISTRY, lease_seconds=5) as rt:
        instrument(rt, provider)
        job_id = rt.submit(charge_plan(), {"side": str(tmp_path / "side"), "amount": 3}).job_id
        crashed = run_driver(
            store_url, "--job", job_id, "--lease", "0.5", crash="tool.after_execute"
        )
        assert crashed.returncode == -9
        assert exporter.get_finished_spans() == ()  # the dead run emitted nothing
        wait_lease_expired(rt.store, job_id)
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
    spans = exporter.get_finished_spans()
    calls = [s for s in spans if s.name == "execute_tool crash_charge"]
    assert len(calls) == 2  # charge1 (caught up) and charge2
    caught = [s for s in calls if s.attributes["affidavit.tool.catch_up"]]  # type: ignore[index]
    assert len(caught) == 1 and caught[0].status.status_code != StatusCode.ERROR
    # the call and the step the dead worker started are marked recovered, nothing else is
    assert [s.attributes["affidavit.step.recovered"] for s in calls] == [  # type: ignore[index]
        s is caught[0] for s in calls
    ]
    recovered = [s.name for s in spans if s.attributes.get("affidavit.step.recovered")]  # type: ignore[union-attr]
    step_id = caught[0].attributes["affidavit.step.id"]  # type: ignore[index]
    [caught_step] = [
        s for s in spans if s.name.startswith("affidavit.step ")
        and s.attributes["affidavit.step.id"] == step_id  # type: ignore[index]
    ]  # fmt: skip
    assert sorted(recovered) == sorted([caught[0].name, caught_step.name])
    steps = [s for s in spans if s.name.startswith("affidavit.step ")]
    assert all(s.status.status_code != StatusCode.ERROR for s in steps), [
        (s.name, s.status.description) for s in steps
    ]


def test_a_step_hook_that_raises_never_fails_the_run(store_url: str) -> None:
    seen: list[tuple[str, int]] = []

    def broken(job_id: str, claimed: int) -> None:
        seen.append((job_id, claimed))
        raise RuntimeError("exporter down")

    with Runtime(store_url, tools=ToolRegistry(TOOL_LIST)) as rt:
        rt.worker.on_step = broken
        job = rt.submit(PLAN, {"amount": 5})
        assert rt.run_job(job.job_id).status == "completed"
        assert verify_job(rt.store, job.job_id).ok
    # told once per step-finishing commit, with the version the run claimed the job at
    assert len(seen) == 2 and {claimed for _, claimed in seen} == {seen[0][1]} and seen[0][1] > 0


def test_live_spans_read_only_what_each_step_added_to_the_log(
    store_url: str,
) -> None:
    """Live spans cost each step a read of the events it added, not of the whole log (which
    made a long job's telemetry quadratic in its length)."""
    steps = 12
    chain: list[dict[str, Any]] = [
        {"id": f"p{i}", "type": "tool", "tool": "otel_pay", "args": {"amount": i}}
        | ({"depends_on": [f"p{i - 1}"]} if i else {})
        for i in range(steps)
    ]
    rt, exporter = traced_runtime(store_url)
    reads: list[int] = []  # events returned by each read of the job's log
    with rt:
        job = rt.submit({"name": "otel-long", "nodes": chain}, {})
        real = rt.store.list_events

        def counted(job_id: str, *, after_version: int = 0, limit: int | None = None) -> Any:
            found = real(job_id, after_version=after_version, limit=limit)
            if job_id == job.job_id:
                reads.append(len(found))
            return found

        rt.store.list_events = counted  # type: ignore[method-assign]
        assert rt.run_job(job.job_id).status == "completed"
        length = len(real(job.job_id))
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("execute_tool otel_pay") == steps
    assert names.count("affidavit.job otel-long") == 1
    # the whole log at most twice (the run's own read of it, and the spans'), not once a step
    assert sum(reads) <= 2 * length, (reads, length)
