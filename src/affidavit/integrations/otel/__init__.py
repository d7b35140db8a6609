"""OpenTelemetry spans for affidavit jobs, the ``affidavit[otel]`` extra (docs/integrations.md).

:func:`instrument` makes a :class:`~affidavit.Runtime` emit its jobs' spans as their steps
finish, following the OpenTelemetry GenAI semantic conventions: a job span (``invoke_agent
NAME`` for an agent job, with the provider, the agent's name, version and id and the job id as
``gen_ai.conversation.id``), a ``chat MODEL`` span per model request (Pydantic AI, the OpenAI
Agents SDK: the models and the token usage recorded), a span per other step and an
``execute_tool TOOL`` span per tool call (the tool the model named, its call id). The spans are
built from the job's event log — their times are the recorded ones — and each carries
``affidavit.job.id`` and the chain hash and version of the event that closed it, so a trace
joins to the job's proof. A job submitted with a ``traceparent`` (HTTP header, or
``Runtime.submit(traceparent=...)``) is a child of that trace.

Off unless configured: :func:`enabled_by_env` reads the standard ``OTEL_*`` variables without
importing OpenTelemetry; ``affidavit run`` / ``worker`` call :func:`instrument_from_env`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from affidavit.integrations.otel.spans import (
        current_traceparent,
        emit_job_spans,
        instrument,
        instrument_from_env,
    )

__all__ = [
    "current_traceparent",
    "emit_job_spans",
    "enabled_by_env",
    "instrument",
    "instrument_from_env",
]


def enabled_by_env() -> bool:
    """Tracing is configured by the standard variables: ``OTEL_TRACES_EXPORTER`` (other than
    ``none``) or an OTLP endpoint, and not ``OTEL_SDK_DISABLED=true``. Imports nothing."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def __getattr__(name: str) -> object:
    if name in ("current_traceparent", "emit_job_spans", "instrument", "instrument_from_env"):
        from affidavit.integrations.otel import spans

        return getattr(spans, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
