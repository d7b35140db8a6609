"""Event types (docs/formats.md §3) and payload validation.

The runtime builds payloads as plain dicts on its hot path; the pydantic models in
:mod:`affidavit.core.payloads` are the single definition of what each payload must contain,
used to validate events at the edges (imports, packs, tests) via :func:`validate_payload`. They
are imported on first use, so that commands which never validate do not pay for building them.
Every payload carries ``at``: RFC 3339 UTC with microseconds, as produced by :func:`utc_now`.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, get_args

from affidavit.core.errors import InvalidEventError

if TYPE_CHECKING:
    from pydantic import BaseModel

# A W3C trace context ``traceparent`` (version 00): the trace the job was submitted in.
TRACEPARENT = r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"


class EventType(StrEnum):
    JOB_CREATED = "job_created"
    PLAN_GENERATED = "plan_generated"
    AGENT_STARTED = "agent_started"
    STEP_CALLED = "step_called"
    NODE_STARTED = "node_started"
    TOOL_INVOCATION_STARTED = "tool_invocation_started"
    TOOL_INVOCATION_FINISHED = "tool_invocation_finished"
    COMMAND_COMMITTED = "command_committed"
    STATE_CHANGED = "state_changed"
    NODE_FINISHED = "node_finished"
    JOB_WAITING = "job_waiting"
    WAIT_COMPLETED = "wait_completed"
    APPROVAL_RECORDED = "approval_recorded"
    JOB_PARKED = "job_parked"
    JOB_RESUMED = "job_resumed"
    CONFIRMATION_WARNING = "confirmation_warning"
    STEP_COMPENSATED = "step_compensated"
    JOB_COMPLETED = "job_completed"
    JOB_FAILED = "job_failed"
    JOB_CANCELLED = "job_cancelled"
    STREAM_EMITTED = "stream_emitted"
    CHILD_COMPLETED = "child_completed"


ResultType = Literal[
    "pure",
    "side_effect_committed",
    "retryable_failure",
    "permanent_failure",
    "compensatable_failure",
    "compensated",
]
RESULT_TYPES: frozenset[str] = frozenset(get_args(ResultType))
COMPLETED_RESULT_TYPES = frozenset({"pure", "side_effect_committed", "compensated"})
FAILED_RESULT_TYPES = frozenset({"retryable_failure", "permanent_failure", "compensatable_failure"})


_second_cache: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """Current UTC time as RFC 3339 with microseconds, e.g. ``2026-11-22T10:00:00.123456Z``."""
    global _second_cache
    micros = time.time_ns() // 1000
    second, fraction = divmod(micros, 1_000_000)
    cached_second, prefix = _second_cache
    if second != cached_second:  # every event carries a timestamp: format the date once a second
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second_cache = (second, prefix)
    return f"{prefix}.{fraction:06d}Z"


def validate_payload(event_type: str, payload: Any) -> BaseModel:
    """Validate ``payload`` against the model of ``event_type``.

    Raises:
        InvalidEventError: unknown type, or the payload lacks/mistypes a field (named).
    """
    from pydantic import ValidationError

    from affidavit.core.payloads import PAYLOAD_MODELS

    try:
        model = PAYLOAD_MODELS[EventType(event_type)]
    except ValueError:
        raise InvalidEventError(f"unknown event type {event_type!r}") from None
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        raise InvalidEventError(f"{event_type} payload: {where}: {first['msg']}") from exc
