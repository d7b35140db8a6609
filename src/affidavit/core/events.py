"""Event types and their payload models (FORMATS.md §3).

The runtime builds payloads as plain dicts on its hot path; these models are the single
definition of what each payload must contain, used to validate events at the edges (imports,
packs, tests) via :func:`validate_payload`. Every payload carries ``at``: RFC 3339 UTC with
microseconds, as produced by :func:`utc_now`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from affidavit.core.errors import AffidavitError


class EventType(StrEnum):
    JOB_CREATED = "job_created"
    PLAN_GENERATED = "plan_generated"
    NODE_STARTED = "node_started"
    TOOL_INVOCATION_STARTED = "tool_invocation_started"
    TOOL_INVOCATION_FINISHED = "tool_invocation_finished"
    COMMAND_COMMITTED = "command_committed"
    STATE_CHANGED = "state_changed"
    NODE_FINISHED = "node_finished"
    JOB_WAITING = "job_waiting"
    WAIT_COMPLETED = "wait_completed"
    JOB_PARKED = "job_parked"
    JOB_RESUMED = "job_resumed"
    CONFIRMATION_WARNING = "confirmation_warning"
    STEP_COMPENSATED = "step_compensated"
    JOB_COMPLETED = "job_completed"
    JOB_FAILED = "job_failed"
    JOB_CANCELLED = "job_cancelled"


ResultType = Literal[
    "pure",
    "side_effect_committed",
    "retryable_failure",
    "permanent_failure",
    "compensatable_failure",
    "compensated",
]
COMPLETED_RESULT_TYPES = frozenset({"pure", "side_effect_committed", "compensated"})

_RFC3339_MICRO = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"


def utc_now() -> str:
    """Current UTC time as RFC 3339 with microseconds, e.g. ``2026-11-22T10:00:00.123456Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    at: str = Field(pattern=_RFC3339_MICRO)


class _StepPayload(_Payload):
    node_id: str
    step_id: str


class JobCreated(_Payload):
    input: Any
    plan_name: str | None
    namespace: str
    submitted_by: str | None
    idempotency_key: str | None


class RetrySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_attempts: int = Field(ge=1)
    backoff_seconds: float = Field(ge=0)


class PolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    in_flight: Literal["park", "fail"]
    replay_verification: Literal["strict", "warn", "human"]
    retry: RetrySettings


class PlanGenerated(_Payload):
    task_graph: dict[str, Any]
    plan_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    policy: PolicySettings


class NodeStarted(_StepPayload):
    attempt: int
    worker_id: str


class ToolInvocationStarted(_StepPayload):
    invocation_id: str
    tool_name: str
    idempotency_key: str
    args_hash: str
    attempt: int


class ToolInvocationFinished(_StepPayload):
    invocation_id: str
    idempotency_key: str
    outcome: Literal["success", "failure", "timeout", "lost"]
    result: Any = None
    error: Any = None
    catch_up: bool


class CommandCommitted(_StepPayload):
    command_id: str
    idempotency_key: str | None = None
    result_hash: str = Field(pattern=r"^[0-9a-f]{64}$")


class StateChange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    resource_type: str
    resource_id: str
    operation: str
    version: str | int | None = None
    etag: str | None = None
    external_ref: str | None = None


class StateChanged(_StepPayload):
    state_changes: list[StateChange]


class NodeFinished(_StepPayload):
    result_type: ResultType
    output: Any = None
    error: Any = None
    attempt: int
    duration_ms: float | int


class JobWaiting(_Payload):
    node_id: str
    wait_type: Literal["signal", "approval"]
    correlation_key: str
    reason: str


class WaitCompleted(_Payload):
    node_id: str
    correlation_key: str
    payload: Any
    signalled_by: str | None


class JobParked(_Payload):
    reason: str
    node_id: str | None
    step_id: str | None
    idempotency_key: str | None = None
    detail: Any


class JobResumed(_Payload):
    decision: Literal["retry", "accept_result", "fail", "continue"]
    result: Any = None
    by: str | None
    note: str | None


class ConfirmationWarning(_StepPayload):
    resource: Any
    reason: str


class StepCompensated(_StepPayload):
    compensation: Any


class JobCompleted(_Payload):
    output: dict[str, Any]


class JobFailed(_Payload):
    error: Any
    node_id: str | None = None


class JobCancelled(_Payload):
    reason: str | None
    by: str | None


PAYLOAD_MODELS: dict[EventType, type[_Payload]] = {
    EventType.JOB_CREATED: JobCreated,
    EventType.PLAN_GENERATED: PlanGenerated,
    EventType.NODE_STARTED: NodeStarted,
    EventType.TOOL_INVOCATION_STARTED: ToolInvocationStarted,
    EventType.TOOL_INVOCATION_FINISHED: ToolInvocationFinished,
    EventType.COMMAND_COMMITTED: CommandCommitted,
    EventType.STATE_CHANGED: StateChanged,
    EventType.NODE_FINISHED: NodeFinished,
    EventType.JOB_WAITING: JobWaiting,
    EventType.WAIT_COMPLETED: WaitCompleted,
    EventType.JOB_PARKED: JobParked,
    EventType.JOB_RESUMED: JobResumed,
    EventType.CONFIRMATION_WARNING: ConfirmationWarning,
    EventType.STEP_COMPENSATED: StepCompensated,
    EventType.JOB_COMPLETED: JobCompleted,
    EventType.JOB_FAILED: JobFailed,
    EventType.JOB_CANCELLED: JobCancelled,
}


class InvalidEventError(AffidavitError):
    code = "invalid_event"
    default_hint = "Event payloads must match FORMATS.md §3."


def validate_payload(event_type: str, payload: Any) -> _Payload:
    """Validate ``payload`` against the model of ``event_type``.

    Raises:
        InvalidEventError: unknown type, or the payload lacks/mistypes a field (named).
    """
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
