"""The spans of agent jobs checked attribute by attribute against the GenAI semantic conventions
(the lists below, written from ``opentelemetry-semantic-conventions``): ``invoke_agent`` per job,
``chat MODEL`` per model request of a Pydantic AI agent and of an OpenAI Agents SDK run (the real
libraries, scripted models), ``execute_tool TOOL`` with the tool the model named and its call
id; the affidavit attributes beside them; on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from affidavit import Runtime, Tool, ToolRegistry
from affidavit.integrations.otel import instrument

# The convention's lists (gen_ai spans: "Required" and the "Conditionally Required ... if
# available" / "Recommended" attributes affidavit can know from a job's record).
INVOKE_AGENT = {
    "required": [gen_ai.GEN_AI_OPERATION_NAME, gen_ai.GEN_AI_PROVIDER_NAME],
    "when_available": [
        gen_ai.GEN_AI_AGENT_ID,
        gen_ai.GEN_AI_AGENT_NAME,
        gen_ai.GEN_AI_CONVERSATION_ID,
    ],
    "recommended": [gen_ai.GEN_AI_AGENT_VERSION],
}
CHAT = {
    "required": [gen_ai.GEN_AI_OPERATION_NAME, gen_ai.GEN_AI_PROVIDER_NAME],
    "when_available": [gen_ai.GEN_AI_REQUEST_MODEL],
    "recommended": [gen_ai.GEN_AI_USAGE_INPUT_TOKENS, gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS],
}
EXECUTE_TOOL = {
    "required": [gen_ai.GEN_AI_OPERATION_NAME],
    "when_available": [],
    "recommended": [gen_ai.GEN_AI_TOOL_CALL_ID, gen_ai.GEN_AI_TOOL_NAME, gen_ai.GEN_AI_TOOL_TYPE],
}
# beside them on every step and tool span: what joins it to the job's proof
AFFIDAVIT = ["affidavit.job.id", "affidavit.step.id", "affidavit.event.chain_hash",
             "affidavit.event.version", "affidavit.step.recovered"]  # fmt: skip


def traced(url: str, tools: list[Tool]) -> tuple[Runtime, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = Runtime(url, tools=ToolRegistry(tools))
    instrument(rt, provider)
    return rt, exporter


def check(span: ReadableSpan, convention: dict[str, list[str]], operation: str) -> None:
    attrs = dict(span.attributes or {})
    for group in ("required", "when_available", "recommended"):
        for name in convention[group]:
            assert name in attrs, (span.name, group, name)
            value = attrs[name]
            assert value not in ("", None), (span.name, name)
            if name.startswith("gen_ai.usage."):
                assert isinstance(value, int) and value >= 0, (span.name, name, value)
            else:
                assert isinstance(value, str), (span.name, name, value)
    assert attrs[gen_ai.GEN_AI_OPERATION_NAME] == operation
    assert span.name.startswith(f"{operation} ")


def spans_of(rt: Runtime, exporter: InMemorySpanExporter, job_id: str) -> list[ReadableSpan]:
    spans = list(exporter.get_finished_spans())
    events = {e.version: e for e in rt.store.list_events(job_id)}
    [job] = [s for s in spans if s.name.startswith("invoke_agent ")]
    for span in spans:
        attrs = dict(span.attributes or {})
        assert attrs["affidavit.job.id"] == job_id
        # the chain hash of the event that closed it, as stored
        assert attrs["affidavit.event.chain_hash"] == (
            events[attrs["affidavit.event.version"]].chain_hash  # type: ignore[index]
        )
        assert span.context.trace_id == job.context.trace_id
        if span is not job:
            assert span.parent is not None
            for name in AFFIDAVIT:
                assert name in attrs, (span.name, name)
    return spans


def check_agent_job(
    rt: Runtime,
    exporter: InMemorySpanExporter,
    job_id: str,
    agent: str,
    version: str,
) -> tuple[list[ReadableSpan], list[ReadableSpan], dict[str, ReadableSpan]]:
    spans = spans_of(rt, exporter, job_id)
    [job] = [s for s in spans if s.name == f"invoke_agent {agent}"]
    check(job, INVOKE_AGENT, "invoke_agent")
    assert job.attributes[gen_ai.GEN_AI_CONVERSATION_ID] == job_id  # type: ignore[index]
    assert job.attributes[gen_ai.GEN_AI_AGENT_NAME] == agent  # type: ignore[index]
    assert job.attributes[gen_ai.GEN_AI_AGENT_VERSION] == version  # type: ignore[index]
    started = next(e for e in rt.store.list_events(job_id) if e.type == "agent_started")
    assert job.attributes[gen_ai.GEN_AI_AGENT_ID] == started.payload["agent_hash"]  # type: ignore[index]
    chats = sorted((s for s in spans if s.name.startswith("chat ")), key=lambda s: s.start_time)  # type: ignore[arg-type, return-value]
    for chat in chats:
        check(chat, CHAT, "chat")
        assert chat.parent.span_id == job.context.span_id  # type: ignore[union-attr]
        assert (
            chat.attributes[gen_ai.GEN_AI_PROVIDER_NAME]
            == (  # type: ignore[index]
                job.attributes[gen_ai.GEN_AI_PROVIDER_NAME]  # type: ignore[index]
            )
        )
    tools = {s.name: s for s in spans if s.name.startswith("execute_tool ")}
    for call in tools.values():
        check(call, EXECUTE_TOOL, "execute_tool")
    return spans, chats, tools


def test_a_pydantic_ai_agent(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.integrations import pydai_tools as pt

    monkeypatch.setenv("PYDAI_SIDE", str(tmp_path / "side.jsonl"))
    out = tmp_path / "out.txt"
    rt, exporter = traced(store_url, pt.support.registrations)
    with rt:
        job_id = rt.submit("support", {"prompt": f"write hello to {out}"}).job_id
        assert rt.run_job(job_id).status == "completed"
        _, chats, tools = check_agent_job(rt, exporter, job_id, "support", pt.support.job.version)
        finished = [e.payload for e in rt.store.list_events(job_id) if e.type == "node_finished"]
    assert len(chats) == 3  # one per model request
    responses = [p["output"] for p in finished if p["node_id"] in {"#0", "#2", "#4"}]
    for chat, response in zip(chats, responses, strict=True):
        assert chat.name == f"chat {chat.attributes[gen_ai.GEN_AI_REQUEST_MODEL]}"  # type: ignore[index]
        assert chat.attributes[gen_ai.GEN_AI_PROVIDER_NAME] == "function"  # type: ignore[index]
        assert chat.attributes[gen_ai.GEN_AI_RESPONSE_MODEL] == response["model_name"]  # type: ignore[index]
        assert (
            chat.attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == response["usage"]["input_tokens"]
        )  # type: ignore[index]
        assert (
            chat.attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == response["usage"]["output_tokens"]
        )  # type: ignore[index]
    # the real tool (its step support.tool.lookup)
    lookup = tools["execute_tool lookup"]
    assert lookup.attributes["affidavit.tool.step_name"] == "support.tool.lookup"  # type: ignore[index]
    assert "execute_tool pydai_write_file" in tools
    assert not any("call_tool" in name for name in tools)


def test_an_openai_agents_sdk_run(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from affidavit.integrations.openai_agents import STEPS
    from tests.integrations import oai_tools as ot

    monkeypatch.setenv("OAI_SIDE", str(tmp_path / "side.jsonl"))
    out = tmp_path / "out.txt"
    rt, exporter = traced(store_url, [*STEPS, *ot.REGISTRATIONS])
    with rt:
        job_id = rt.submit("oai_support", {"prompt": f"write hello to {out}"}).job_id
        assert rt.run_job(job_id).status == "completed"
        _, chats, tools = check_agent_job(rt, exporter, job_id, "oai_support", "1")
        finished = {
            e.payload["step_id"]: e.payload
            for e in rt.store.list_events(job_id)
            if e.type == "node_finished"
        }
    assert len(chats) == 3
    for chat in chats:
        usage = finished[chat.attributes["affidavit.step.id"]]["output"]["usage"]  # type: ignore[index]
        assert chat.attributes[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == usage["input_tokens"]  # type: ignore[index]
        assert chat.attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["output_tokens"]  # type: ignore[index]
    assert tools["execute_tool lookup"].attributes[gen_ai.GEN_AI_TOOL_CALL_ID] == "call-1"  # type: ignore[index]
    assert "execute_tool oai_write_file" in tools
