"""Pydantic models of every event payload (docs/formats.md §3), keyed by event type."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from affidavit.core.agent_steps import AgentKind
from affidavit.core.events import TRACEPARENT, EventType, ResultType

_RFC3339_MICRO = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    at: str = Field(pattern=_RFC3339_MICRO)


class _StepPayload(_Payload):
    node_id: str
    step_id: str


class ReusedStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node_id: str = Field(max_length=256)
    step_id: str = Field(max_length=256)  # the source job's step id
    output: Any  # the source's recorded output of the step
    # an agent job's step: its source's step_called (the new job's step id derives from it)
    seq: int | None = Field(default=None, ge=0)
    kind: str | None = Field(default=None, max_length=32)
    tool_name: str | None = Field(default=None, max_length=256)
    args: dict[str, Any] | None = None
    args_hash: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")


class ForkedFrom(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    job_id: str = Field(max_length=256)
    seal_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    step: str = Field(max_length=256)  # the node id the prefix ends with
    reused: list[ReusedStep] = Field(min_length=1, max_length=10_000)


class JobCreated(_Payload):
    input: Any
    plan_name: str | None
    namespace: str
    submitted_by: str | None
    idempotency_key: str | None
    kind: Literal["agent"] | None = None  # absent on plan jobs
    traceparent: str | None = Field(None, pattern=TRACEPARENT)
    forked_from: ForkedFrom | None = None  # absent on a job that is no fork
    parent_job_id: str | None = None  # a child job (ctx.start_job): its parent
    parent_step_id: str | None = None  # and the parent's step that created it
    tags: dict[str, str] | None = None  # absent on a job without tags (see core/tags.py)


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


class AgentPolicySettings(PolicySettings):
    max_concurrency: int = Field(ge=1)


class BudgetSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tool_calls: int | None = Field(default=None, ge=0)
    model_tokens: int | None = Field(default=None, ge=0)
    cost: float | None = Field(default=None, ge=0)


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tokens: int | None = Field(default=None, ge=0)
    cost: float | None = Field(default=None, ge=0)


class StreamSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_values: int = Field(ge=1)
    max_bytes: int = Field(ge=1)


class AgentStarted(_Payload):
    agent: str
    agent_version: str | None  # None: not pinned (any code reproducing the calls continues)
    agent_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    code_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # the submitter's source
    policy: AgentPolicySettings
    budget: BudgetSettings | None = None  # affidavit.Budget (core/budget.py)
    stream: StreamSettings | None = None  # affidavit.StreamLimit (core/streams.py)


class StepCalled(_StepPayload):
    seq: int = Field(ge=0)
    kind: AgentKind
    tool_name: str | None
    args: dict[str, Any]
    args_hash: str = Field(pattern=r"^[0-9a-f]{16}$")
    code_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")  # the caller's source


class NodeStarted(_StepPayload):
    attempt: int
    worker_id: str


class LimitGrant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    limit: str
    grant_id: str
    granted_at: str
    attempt_id: str
    rate: tuple[int, int] | None = None  # (count, period in µs)
    concurrency: int | None = None


class ToolInvocationStarted(_StepPayload):
    invocation_id: str
    tool_name: str
    idempotency_key: str
    args_hash: str
    attempt: int
    # a tool that required approval of this call, and the approval's correlation key
    requires_approval: Literal[True] | None = None
    approval_key: str | None = None
    # a limited call's grant (runtime/_limits.py): taken before this event was written
    limit_grant: LimitGrant | None = None
    # the call's time limit, and whether its tool is declared safe to repeat (runtime/_timeouts.py)
    timeout_seconds: float | None = Field(default=None, gt=0)
    idempotent: Literal[True] | None = None


class ToolInvocationFinished(_StepPayload):
    invocation_id: str
    idempotency_key: str
    outcome: Literal["success", "failure", "timeout", "lost", "unknown"]
    result: Any = None
    error: Any = None
    catch_up: bool
    # a call that ran past its time limit: the limit, and what resolved it (runtime/_timeouts.py)
    timeout_seconds: float | None = Field(default=None, gt=0)
    resolution: Literal["retry", "reconcile"] | None = None


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
    usage: Usage | None = None  # what the step spent (ctx.report_usage)
    limit_grant: LimitGrant | None = None  # a limited pure step's grant (runtime/_limits.py)


class JobWaiting(_Payload):
    node_id: str
    wait_type: Literal["signal", "approval", "timer", "child"]
    correlation_key: str
    reason: str
    wake_at: str | None = Field(default=None, pattern=_RFC3339_MICRO)  # timers and timeouts
    approvers: list[str] | None = None  # approvals: who may decide (roles, principals)
    min_approvals: int | None = Field(default=None, ge=1)
    call: dict[str, Any] | None = None  # the approval of one tool call: step, tool, args


# A value a person supplied, sealed under its subject's key (core/privacy.py): an object
# {"affidavit:sealed": "v1", "kid", "ct"} where the field holds text otherwise.
SealedText = dict[str, str]


class Decision(_Payload):
    principal: str
    role: str
    key_id: str | None
    approved: bool
    comment: str | SealedText | None = None


class WaitCompleted(_Payload):
    node_id: str
    correlation_key: str
    payload: Any
    signalled_by: str | None
    decided_by: list[Decision] | None = None  # an approval: every decision that counted


class ApprovalRecorded(Decision):
    node_id: str
    correlation_key: str


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
    note: str | SealedText | None
    budget: BudgetSettings | None = None  # the new budget, continuing a budget_exceeded park


class ConfirmationWarning(_StepPayload):
    resource: Any
    reason: str


class StepCompensated(_StepPayload):
    compensation: Any


class JobCompleted(_Payload):
    output: Any  # a plan job's: an object (sink node id -> output); an agent's: its return


class JobFailed(_Payload):
    error: Any
    node_id: str | None = None


class JobCancelled(_Payload):
    reason: str | None
    by: str | None


class StreamEmitted(_Payload):
    seq: int = Field(ge=0)
    value: Any
    # the step that emitted it (all three, or none: the agent function's own value)
    node_id: str | None = None
    step_id: str | None = None
    attempt: int | None = Field(default=None, ge=1)


class ChildCompleted(_Payload):
    """A child job (``ctx.start_job``) ended, as its parent's join saw it: the child's final
    status, chain head and seal hash (what ``verify --tree`` holds the child to)."""

    node_id: str  # the join step
    job_id: str
    status: Literal["completed", "failed", "cancelled"]
    chain_head: str
    event_count: int = Field(ge=1)
    seal_sha256: str | None
    output: Any = None
    error: Any = None


PAYLOAD_MODELS: dict[EventType, type[_Payload]] = {
    EventType.JOB_CREATED: JobCreated,
    EventType.PLAN_GENERATED: PlanGenerated,
    EventType.AGENT_STARTED: AgentStarted,
    EventType.STEP_CALLED: StepCalled,
    EventType.NODE_STARTED: NodeStarted,
    EventType.TOOL_INVOCATION_STARTED: ToolInvocationStarted,
    EventType.TOOL_INVOCATION_FINISHED: ToolInvocationFinished,
    EventType.COMMAND_COMMITTED: CommandCommitted,
    EventType.STATE_CHANGED: StateChanged,
    EventType.NODE_FINISHED: NodeFinished,
    EventType.JOB_WAITING: JobWaiting,
    EventType.WAIT_COMPLETED: WaitCompleted,
    EventType.APPROVAL_RECORDED: ApprovalRecorded,
    EventType.JOB_PARKED: JobParked,
    EventType.JOB_RESUMED: JobResumed,
    EventType.CONFIRMATION_WARNING: ConfirmationWarning,
    EventType.STEP_COMPENSATED: StepCompensated,
    EventType.JOB_COMPLETED: JobCompleted,
    EventType.JOB_FAILED: JobFailed,
    EventType.JOB_CANCELLED: JobCancelled,
    EventType.STREAM_EMITTED: StreamEmitted,
    EventType.CHILD_COMPLETED: ChildCompleted,
}
