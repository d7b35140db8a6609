"""A job's spans, built from its event log (see the package docstring)."""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from affidavit import ConfigError, JobRecord, Runtime, Store, StoredEvent, __version__

__all__ = ["current_traceparent", "emit_job_spans", "instrument", "instrument_from_env"]

log = logging.getLogger("affidavit.integrations.otel")

# runs that end in these statuses get their job's spans (cancel happens outside a run)
SETTLED = frozenset({"completed", "failed"})
_TERMINAL_EVENTS = frozenset({"job_completed", "job_failed", "job_cancelled"})
_propagator = TraceContextTextMapPropagator()


def _ns(at: Any, fallback: int) -> int:
    """Nanoseconds since the epoch of an event's ``at`` (RFC 3339, ``Z``)."""
    if not isinstance(at, str):
        return fallback
    try:
        return int(datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        return fallback


def _proof(event: StoredEvent) -> dict[str, Any]:
    """The attributes that join a span to the job's proof: the closing event's chain hash."""
    return {
        "affidavit.event.chain_hash": event.chain_hash,
        "affidavit.event.version": event.version,
    }


def current_traceparent() -> str | None:
    """The current OpenTelemetry context as a W3C ``traceparent`` (``None`` outside a span):
    pass it to ``Runtime.submit(traceparent=...)`` so the job's spans join the caller's trace."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def _job_span(
    tracer: Tracer, job_id: str, job: JobRecord, events: list[StoredEvent], start: int
) -> tuple[Span, otel_context.Context]:
    """Open the job span (``invoke_agent NAME`` or ``affidavit.job PLAN``) under the
    ``traceparent`` recorded at submit, else in a new trace; return it and its context."""
    first = events[0].payload if isinstance(events[0].payload, dict) else {}
    parent = otel_context.Context()  # never the worker's current context
    traceparent = first.get("traceparent")
    if isinstance(traceparent, str):
        parent = _propagator.extract({"traceparent": traceparent}, context=parent)

    agent = next(
        (e.payload.get("agent") for e in events[:3] if e.type == "agent_started"),
        None,
    )
    attributes: dict[str, Any] = {
        "affidavit.job.id": job_id,
        "affidavit.job.status": job.status,
        "affidavit.job.namespace": job.namespace,
    }
    if first.get("kind") == "agent" or agent is not None:
        name = str(agent or first.get("plan_name") or "agent")
        span_name = f"invoke_agent {name}"
        attributes |= {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
    else:
        span_name = f"affidavit.job {first.get('plan_name') or job_id}"
        attributes["affidavit.plan.name"] = str(first.get("plan_name"))
    job_span = tracer.start_span(span_name, context=parent, start_time=start, attributes=attributes)
    return job_span, trace.set_span_in_context(job_span, parent)


class _StepSpans:
    """The step and tool spans under one job span, opened and closed as its log is read."""

    def __init__(self, tracer: Tracer, job_id: str, job_ctx: otel_context.Context) -> None:
        self.tracer = tracer
        self.job_id = job_id
        self.job_ctx = job_ctx
        self.count = 0
        self.steps: dict[tuple[str, Any], Span] = {}  # (node id, attempt) → open step span
        self.latest_step: dict[str, Span] = {}  # node id → its latest step span
        self.calls: dict[str, Span] = {}  # invocation id → open execute_tool span

    def node_started(self, p: dict[str, Any], node: str, at: int) -> None:
        span = self.tracer.start_span(
            f"affidavit.step {node}",
            context=self.job_ctx,
            start_time=at,
            attributes={
                "affidavit.job.id": self.job_id,
                "affidavit.node.id": node,
                "affidavit.step.id": str(p.get("step_id")),
                "affidavit.step.attempt": int(p.get("attempt") or 0),
            },
        )
        self.steps[(node, p.get("attempt"))] = self.latest_step[node] = span
        self.count += 1

    def node_finished(self, event: StoredEvent, p: dict[str, Any], node: str, at: int) -> None:
        span_or_none = self.steps.pop((node, p.get("attempt")), None)
        if span_or_none is None:  # finished by a later attempt: close the node's open one
            open_keys = [k for k in self.steps if k[0] == node]
            span_or_none = self.steps.pop(open_keys[-1]) if open_keys else None
        if span_or_none is not None:
            result_type = str(p.get("result_type"))
            span_or_none.set_attributes(
                {"affidavit.step.result_type": result_type, **_proof(event)}
            )
            if result_type.endswith("_failure"):
                span_or_none.set_status(Status(StatusCode.ERROR, result_type))
            span_or_none.end(end_time=at)

    def tool_started(self, p: dict[str, Any], node: Any, at: int) -> None:
        step_span = self.latest_step.get(node) if isinstance(node, str) else None
        ctx = trace.set_span_in_context(step_span, self.job_ctx) if step_span else self.job_ctx
        tool = str(p.get("tool_name"))
        self.calls[str(p.get("invocation_id"))] = self.tracer.start_span(
            f"execute_tool {tool}",
            context=ctx,
            start_time=at,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": str(p.get("step_id")),
                "gen_ai.tool.type": "function",
                "affidavit.job.id": self.job_id,
                "affidavit.idempotency_key": str(p.get("idempotency_key")),
                "affidavit.tool.attempt": int(p.get("attempt") or 0),
            },
        )
        self.count += 1

    def tool_finished(self, event: StoredEvent, p: dict[str, Any], at: int) -> None:
        call = self.calls.pop(str(p.get("invocation_id")), None)
        if call is not None:
            outcome = str(p.get("outcome"))
            call.set_attributes(
                {
                    "affidavit.tool.outcome": outcome,
                    "affidavit.tool.catch_up": bool(p.get("catch_up")),
                    **_proof(event),
                }
            )
            if outcome != "success":
                call.set_status(Status(StatusCode.ERROR, outcome))
            call.end(end_time=at)

    def end_open(self, end: int) -> None:
        """End, in error, every span the log never closed."""
        for open_span in [*self.calls.values(), *self.steps.values()]:
            open_span.set_status(Status(StatusCode.ERROR, "not finished in the log"))
            open_span.end(end_time=end)


def emit_job_spans(store: Store, job_id: str, tracer: Tracer) -> int:
    """Emit the spans of job ``job_id`` from its log; return how many.

    One job span — ``invoke_agent NAME`` for an agent job, ``affidavit.job PLAN`` for a plan
    job — from ``job_created`` to the job's last event; under it one ``affidavit.step NODE``
    span per node attempt (``node_started`` → ``node_finished``), and under a tool step one
    ``execute_tool TOOL`` span per invocation (``tool_invocation_started`` → ``_finished``).
    A span the log never closed ends with the job, in error. The job span's parent is the
    ``traceparent`` recorded at submit, else none (a new trace).
    """
    events = store.list_events(job_id)
    if not events:
        return 0
    job = store.get_job(job_id)
    first = events[0].payload if isinstance(events[0].payload, dict) else {}
    start = _ns(first.get("at"), 0)
    last = events[-1]
    end = _ns(last.payload.get("at") if isinstance(last.payload, dict) else None, start)
    job_span, job_ctx = _job_span(tracer, job_id, job, events, start)
    spans = _StepSpans(tracer, job_id, job_ctx)

    closing: StoredEvent | None = None
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        at = _ns(p.get("at"), end)
        node = p.get("node_id")
        if event.type == "node_started" and isinstance(node, str):
            spans.node_started(p, node, at)
        elif event.type == "node_finished" and isinstance(node, str):
            spans.node_finished(event, p, node, at)
        elif event.type == "tool_invocation_started":
            spans.tool_started(p, node, at)
        elif event.type == "tool_invocation_finished":
            spans.tool_finished(event, p, at)
        elif event.type in _TERMINAL_EVENTS:
            closing = event

    spans.end_open(end)
    job_span.set_attributes(_proof(closing or last))
    if job.status == "failed":
        job_span.set_status(Status(StatusCode.ERROR, "job failed"))
    job_span.end(end_time=end)
    return 1 + spans.count


def instrument(runtime: Runtime, tracer_provider: TracerProvider | None = None) -> Tracer:
    """Emit a job's spans (:func:`emit_job_spans`) whenever a run of ``runtime``'s worker
    leaves it completed or failed. A failure to emit is logged, never raised into the run.
    ``tracer_provider`` defaults to the global one. Returns the tracer used."""
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    tracer = provider.get_tracer("affidavit", __version__)
    previous: Callable[[str, str, float], None] | None = runtime.worker.on_job

    def on_job(job_id: str, status: str, seconds: float) -> None:
        if previous is not None:
            previous(job_id, status, seconds)
        if status in SETTLED:
            try:
                emit_job_spans(runtime.store, job_id, tracer)
            except Exception:  # telemetry must not fail a job's run
                log.warning("spans of job %s were not emitted", job_id, exc_info=True)

    runtime.worker.on_job = on_job
    return tracer


def _exporter(name: str) -> SpanExporter:
    found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
    if not found:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed",
            hint="Install its package (otlp: pip install opentelemetry-exporter-otlp), or set "
            "OTEL_TRACES_EXPORTER=console.",
        )
    exporter: SpanExporter = found[0].load()()
    return exporter


def instrument_from_env(runtime: Runtime) -> SdkTracerProvider:
    """Instrument ``runtime`` with a tracer provider configured by the standard variables:
    ``OTEL_TRACES_EXPORTER`` (comma-separated; default ``otlp``, which needs
    ``opentelemetry-exporter-otlp``), ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``, and
    the exporter's own ``OTEL_EXPORTER_*``. Spans are exported in batches, flushed at exit.

    Raises:
        ConfigError: an exporter that is not installed.
    """
    import os

    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    provider = SdkTracerProvider(resource=Resource.create())
    for name in (n.strip().lower() for n in names.split(",")):
        if name and name != "none":
            provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    atexit.register(provider.shutdown)
    instrument(runtime, provider)
    return provider
