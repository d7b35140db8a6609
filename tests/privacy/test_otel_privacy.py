"""OpenTelemetry spans of a subject's job (``affidavit.integrations.otel``, on both backends):
no span name, attribute or status carries a value the subject's key seals — its input, a
call's arguments (a model's name among them), a tool's result or error, a model's response,
the job's output or error — in plain text. The same job without a subject shows what the
spans would otherwise carry (the model's name and usage): the check reads where a value would
be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from affidavit import AgentContext, Runtime, ToolContext, ToolRegistry, agent, pure
from affidavit.integrations.otel import instrument
from tests.privacy import subject_tools as st

MODEL = "canary-model-4b1e"  # the model's name: in the call's arguments, sealed for a subject


@pure("pv_otel.model_request")
def model_request(ctx: ToolContext, model: str, prompt: str) -> dict[str, Any]:
    return {
        "model_name": MODEL,
        "provider_response_id": f"resp-{MODEL}",
        "usage": {"input_tokens": 11, "output_tokens": 7},
        "text": f"hello {prompt}",
    }


@agent("pv_otel", version="1")
def otel_agent(ctx: AgentContext, email: str) -> Any:
    reply = ctx.call(model_request, model=f"openai:{MODEL}", prompt=email)
    sent = ctx.call(st.send_email, to=email, body=reply["text"])
    return {"reply": reply, "sent": sent}


def _registry() -> ToolRegistry:
    return ToolRegistry(
        [model_request, otel_agent, st.send_email, st.fail, st.tool_error, st.agent_error]
    )


def _texts(spans: tuple[ReadableSpan, ...]) -> str:
    """Everything the spans say, as one text."""
    parts: list[Any] = []
    for span in spans:
        parts += [span.name, dict(span.attributes or {}), span.status.description]
        parts += [(e.name, dict(e.attributes or {})) for e in span.events]
    return json.dumps(parts, default=str, ensure_ascii=False)


ENDS = {"pv_otel": "completed", "pv_tool_error": "failed", "pv_agent_error": "failed"}


def _traced(store_url: str, master_key: Path, agent_name: str, subject: str | None) -> str:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with Runtime(store_url, tools=_registry(), master_key=master_key) as rt:
        instrument(rt, provider)
        job = rt.submit(agent_name, {"email": st.CANARY}, subject=subject)
        assert rt.run_job(job.job_id).status == ENDS[agent_name]
    spans = exporter.get_finished_spans()
    assert spans and any(s.name.startswith("invoke_agent") for s in spans)
    return _texts(spans)


def test_without_a_subject_the_spans_carry_the_model_and_its_usage(
    store_url: str, master_key: Path
) -> None:
    text = _traced(store_url, master_key, "pv_otel", None)
    assert f"chat {MODEL}" in text and "gen_ai.usage.input_tokens" in text


@pytest.mark.parametrize("agent_name", ["pv_otel", "pv_tool_error", "pv_agent_error"])
def test_a_subjects_spans_carry_none_of_its_sealed_values(
    store_url: str, master_key: Path, agent_name: str
) -> None:
    text = _traced(store_url, master_key, agent_name, "customer-7")
    assert "invoke_agent" in text and ("execute_tool" in text or agent_name == "pv_agent_error")
    assert st.CANARY not in text
    assert MODEL not in text  # the model's name, its response id: in sealed values
    assert "customer-7" not in text
