"""A job's spans, built from its event log (see the package docstring)."""

from __future__ import annotations

import atexit
import copy
import hashlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from affidavit import ConfigError, Runtime, Store, StoredEvent, __version__
from affidavit.integrations.otel import _genai

__all__ = ["current_traceparent", "emit_job_spans", "instrument", "instrument_from_env"]

log = logging.getLogger("affidavit.integrations.otel")

# runs that end in these statuses get their job's span (cancel happens outside a run)
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


def _id(job_id: str, *parts: object) -> int:
    """A span id made from the job id and what names the span in its log: every process that
    emits a span of the job gives its parent the same id (never 0, which is invalid)."""
    text = "\x00".join([job_id, *(str(p) for p in parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") or 1


class _FixedIds(IdGenerator):
    def __init__(self, trace_id: int, span_id: int) -> None:
        self.trace_id, self.span_id = trace_id, span_id

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id


@dataclass
class _Record:
    """One span as the log tells it; ``closed`` is the version of the event that ended it."""

    name: str
    span_id: int
    parent_id: int | None  # None: the job span, under the submitter's traceparent
    start: int
    attributes: dict[str, Any]
    opened: int  # the version of the event that started it
    end: int = 0
    closed: int = 0
    error: str | None = None
    key: tuple[Any, ...] = field(default=())


def _step_record(
    job_id: str,
    job: _Record,
    event: StoredEvent,
    p: dict[str, Any],
    at: int,
    called: dict[str, Any] | None,
    providers: list[str],
) -> _Record:
    """A step span, opened by ``node_started``: ``chat MODEL`` for a model request."""
    node, attempt = str(p.get("node_id")), int(p.get("attempt") or 0)
    record = _Record(
        f"affidavit.step {node}",
        _id(job_id, "step", node, attempt, event.version),
        job.span_id,
        at,
        {
            "affidavit.job.id": job_id,
            "affidavit.node.id": node,
            "affidavit.step.id": str(p.get("step_id")),
            "affidavit.step.attempt": attempt,
        },
        event.version,
    )
    if called is not None and _genai.is_model_step(called):
        chat = _genai.chat_attributes(called)
        providers.append(chat["gen_ai.provider.name"])
        record.name = f"chat {chat['gen_ai.request.model']}"
        record.attributes |= chat
    return record


def _tool_record(
    job_id: str,
    parent: _Record,
    event: StoredEvent,
    p: dict[str, Any],
    at: int,
    called: dict[str, Any] | None,
) -> _Record:
    """An ``execute_tool`` span, opened by ``tool_invocation_started``, under its step."""
    genai = _genai.tool_attributes(str(p.get("tool_name")), str(p.get("step_id")), called)
    return _Record(
        f"execute_tool {genai['gen_ai.tool.name']}",
        _id(job_id, "tool", p.get("invocation_id")),
        parent.span_id,
        at,
        genai
        | {
            "affidavit.job.id": job_id,
            "affidavit.step.id": str(p.get("step_id")),
            "affidavit.idempotency_key": str(p.get("idempotency_key")),
            "affidavit.tool.attempt": int(p.get("attempt") or 0),
        },
        event.version,
    )


def _log_spans(job_id: str, events: list[StoredEvent]) -> tuple[_Record, list[_Record]]:
    """Read the log: the job span and every step / tool span, closed or not."""
    first = events[0].payload if isinstance(events[0].payload, dict) else {}
    start = _ns(first.get("at"), 0)
    called: dict[str, dict[str, Any]] = {}  # node id → its step_called payload
    started: dict[str, Any] = {}
    providers: list[str] = []
    steps: dict[tuple[str, Any], _Record] = {}  # open step spans
    latest: dict[str, _Record] = {}  # node id → its latest step span
    calls: dict[str, _Record] = {}  # invocation id → open execute_tool span
    spans: list[_Record] = []
    job = _Record("", _id(job_id, "job"), None, start, {"affidavit.job.id": job_id}, 1)
    for event in events:
        p = event.payload if isinstance(event.payload, dict) else {}
        at = _ns(p.get("at"), start)
        node = p.get("node_id")
        if event.type == "agent_started":
            started = p
        elif event.type == "step_called" and isinstance(node, str):
            called[node] = p
        elif event.type == "node_started" and isinstance(node, str):
            record = _step_record(job_id, job, event, p, at, called.get(node), providers)
            steps[(node, p.get("attempt"))] = latest[node] = record
            spans.append(record)
        elif event.type == "node_finished" and isinstance(node, str):
            record_or_none = steps.pop((node, p.get("attempt")), None)
            if record_or_none is None:  # finished by a later attempt: close the open one
                open_keys = [k for k in steps if k[0] == node]
                record_or_none = steps.pop(open_keys[-1]) if open_keys else None
            if record_or_none is not None:
                result_type = str(p.get("result_type"))
                record_or_none.attributes["affidavit.step.result_type"] = result_type
                if record_or_none.name.startswith("chat "):
                    record_or_none.attributes |= _genai.response_attributes(p.get("output"))
                record_or_none.attributes |= _proof(event)
                record_or_none.end, record_or_none.closed = at, event.version
                if result_type.endswith("_failure"):
                    record_or_none.error = result_type
        elif event.type == "tool_invocation_started":
            parent = latest.get(node) if isinstance(node, str) else None
            invocation = str(p.get("invocation_id"))
            step_called = called.get(node) if isinstance(node, str) else None
            record = _tool_record(job_id, parent or job, event, p, at, step_called)
            calls[invocation] = record
            spans.append(record)
        elif event.type == "tool_invocation_finished":
            call = calls.pop(str(p.get("invocation_id")), None)
            if call is not None:
                outcome = str(p.get("outcome"))
                call.attributes |= {
                    "affidavit.tool.outcome": outcome,
                    "affidavit.tool.catch_up": bool(p.get("catch_up")),
                    **_proof(event),
                }
                call.end, call.closed = at, event.version
                if outcome != "success":
                    call.error = outcome
        elif event.type in _TERMINAL_EVENTS:
            job.end, job.closed = at, event.version
            job.attributes |= _proof(event)
            if event.type != "job_completed":
                job.error = event.type
    _name_job(job, job_id, first, started, providers)
    return job, spans


def _name_job(
    job: _Record,
    job_id: str,
    first: dict[str, Any],
    started: dict[str, Any],
    providers: list[str],
) -> None:
    """``invoke_agent NAME`` for an agent job, ``affidavit.job PLAN`` for a plan job."""
    if first.get("kind") == "agent" or started:
        name = str(started.get("agent") or first.get("plan_name") or "agent")
        job.name = f"invoke_agent {name}"
        provider = providers[0] if providers else _genai.DEFAULT_PROVIDER
        job.attributes |= _genai.agent_attributes(job_id, name, started, provider)
    else:
        job.name = f"affidavit.job {first.get('plan_name') or job_id}"
        job.attributes["affidavit.plan.name"] = str(first.get("plan_name"))


def _parent_context(
    job_id: str, first: dict[str, Any]
) -> tuple[otel_context.Context, int, TraceFlags]:
    """The job span's parent (the ``traceparent`` recorded at submit, else none), the job's
    trace id (the traceparent's, else one made from the job id) and its flags (sampled)."""
    parent = otel_context.Context()  # never the worker's current context
    traceparent = first.get("traceparent")
    if isinstance(traceparent, str):
        parent = _propagator.extract({"traceparent": traceparent}, context=parent)
    remote = trace.get_current_span(parent).get_span_context()
    if remote.is_valid:
        return parent, remote.trace_id, remote.trace_flags
    digest = hashlib.sha256(f"{job_id}\x00trace".encode()).digest()
    return parent, int.from_bytes(digest[:16], "big") or 1, TraceFlags(TraceFlags.SAMPLED)


def _emit(
    tracer: Tracer,
    record: _Record,
    parent: otel_context.Context,
    trace_id: int,
    flags: TraceFlags,
) -> None:
    if isinstance(tracer, SdkTracer):  # the span gets the id its children name as parent
        tracer = copy.copy(tracer)
        tracer.id_generator = _FixedIds(trace_id, record.span_id)
    if record.parent_id is not None:
        context = SpanContext(trace_id, record.parent_id, False, flags)
        parent = trace.set_span_in_context(NonRecordingSpan(context), otel_context.Context())
    span = tracer.start_span(
        record.name, context=parent, start_time=record.start, attributes=record.attributes
    )
    if record.error is not None:  # error.type: conditionally required on a failed operation
        span.set_attribute(ERROR_TYPE, record.error)
        span.set_status(Status(StatusCode.ERROR, record.error))
    span.end(end_time=record.end)


def emit_job_spans(
    store: Store,
    job_id: str,
    tracer: Tracer,
    *,
    after: int = 0,
    recovered_before: int = 0,
    events: list[StoredEvent] | None = None,
) -> tuple[int, int]:
    """Emit the spans of job ``job_id`` that events after version ``after`` closed; return how
    many, and the version read up to (the next call's ``after``).

    One job span — ``invoke_agent NAME`` for an agent job, ``affidavit.job PLAN`` for a plan
    job — from ``job_created`` to the job's terminal event, emitted with it; under it one span
    per node attempt (``node_started`` → ``node_finished``): ``chat MODEL`` for a model
    request, ``affidavit.step NODE`` otherwise; and under a tool step one ``execute_tool TOOL``
    span per invocation (``tool_invocation_started`` → ``_finished``). A span the log never
    closed is emitted with the job span, ending with it, in error. A span opened at or before
    version ``recovered_before`` (the claim of the run that closes it) and not waited on since
    (``job_waiting``) is marked ``affidavit.step.recovered``: a crash or a lost lease cut the
    run that opened it. Span ids are made from the job id, so the spans of one job
    emitted by several processes form one tree (with the SDK's tracer). ``events``: the job's
    whole log as read already (else it is read from ``store``).
    """
    if events is None:
        events = store.list_events(job_id)
    if not events:
        return 0, after
    job, spans = _log_spans(job_id, events)
    first = events[0].payload if isinstance(events[0].payload, dict) else {}
    parent, trace_id, flags = _parent_context(job_id, first)
    # a step open across a wait was waited on; one open when an earlier run ended otherwise
    # (a crash, a lost lease) was caught by the run that closed it
    waits = [e.version for e in events if e.type == "job_waiting"]
    count = 0
    for record in spans:
        dangling = not record.closed and job.closed > after
        if record.closed > after or dangling:
            if dangling:
                record.end, record.error = job.end, "not finished in the log"
            record.attributes["affidavit.step.recovered"] = record.opened <= recovered_before and (
                not any(record.opened < v <= recovered_before for v in waits)
            )
            _emit(tracer, record, parent, trace_id, flags)
            count += 1
    if job.closed > after:
        stored = store.get_job(job_id)
        job.attributes["affidavit.job.status"] = stored.status
        job.attributes["affidavit.job.namespace"] = stored.namespace
        _emit(tracer, job, parent, trace_id, flags)
        count += 1
    return count, events[-1].version


class _Live:
    """Emits a job's spans as its steps finish: what each run closed, once per process. The
    log of a job in a run is read once and then only what each step added to it."""

    def __init__(self, store: Store, tracer: Tracer) -> None:
        self.store, self.tracer = store, tracer
        self.lock = threading.Lock()
        self.runs: dict[str, tuple[int, int]] = {}  # job id → (version at claim, emitted up to)
        self.logs: dict[str, list[StoredEvent]] = {}  # job id → its log as read so far

    def _log(self, job_id: str) -> list[StoredEvent]:
        log = self.logs.setdefault(job_id, [])
        log += self.store.list_events(job_id, after_version=log[-1].version if log else 0)
        return log

    def step(self, job_id: str, claimed: int) -> None:
        with self.lock:
            _, done = self.runs.get(job_id, (claimed, claimed))
            _, done = emit_job_spans(
                self.store,
                job_id,
                self.tracer,
                after=max(done, claimed),
                recovered_before=claimed,
                events=self._log(job_id),
            )
            self.runs[job_id] = (claimed, done)

    def run_ended(self, job_id: str, status: str) -> None:
        with self.lock:
            run = self.runs.pop(job_id, None)
            events = self._log(job_id)
            del self.logs[job_id]
            if status in SETTLED and events:
                claimed, done = run if run is not None else (0, 0)
                if run is None:  # no step finished in this run: only the job span is new
                    done = events[-1].version - 1
                emit_job_spans(
                    self.store,
                    job_id,
                    self.tracer,
                    after=done,
                    recovered_before=claimed,
                    events=events,
                )


def instrument(runtime: Runtime, tracer_provider: TracerProvider | None = None) -> Tracer:
    """Emit the spans of ``runtime``'s jobs (:func:`emit_job_spans`) as its worker runs them:
    a step's spans when the transaction that finished it commits, the job span when a run
    leaves the job completed or failed. A failure to emit is logged, never raised into the
    run. ``tracer_provider`` defaults to the global one. Returns the tracer used."""
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    tracer = provider.get_tracer("affidavit", __version__)
    live = _Live(runtime.store, tracer)
    worker = runtime.worker
    previous: Callable[[str, str, float], None] | None = worker.on_job
    previous_step: Callable[[str, int], None] | None = worker.on_step

    def on_step(job_id: str, claimed: int) -> None:
        if previous_step is not None:
            previous_step(job_id, claimed)
        try:
            live.step(job_id, claimed)
        except Exception:  # telemetry must not fail a step
            log.warning("spans of job %s were not emitted", job_id, exc_info=True)

    def on_job(job_id: str, status: str, seconds: float) -> None:
        if previous is not None:
            previous(job_id, status, seconds)
        try:
            live.run_ended(job_id, status)
        except Exception:  # telemetry must not fail a job's run
            log.warning("spans of job %s were not emitted", job_id, exc_info=True)

    worker.on_step = on_step
    worker.on_job = on_job
    return tracer


def _exporter(name: str) -> SpanExporter:
    if name == "console":  # stdout is the command's output
        return ConsoleSpanExporter(out=sys.stderr)
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
    ``opentelemetry-exporter-otlp``; ``console`` writes to stderr), ``OTEL_SERVICE_NAME`` /
    ``OTEL_RESOURCE_ATTRIBUTES``, and the exporter's own ``OTEL_EXPORTER_*``. Spans are
    exported in batches, flushed at exit.

    Raises:
        ConfigError: an exporter that is not installed.
    """
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp"
    provider = SdkTracerProvider(resource=Resource.create())
    for name in (n.strip().lower() for n in names.split(",")):
        if name and name != "none":
            provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    atexit.register(provider.shutdown)
    instrument(runtime, provider)
    return provider
