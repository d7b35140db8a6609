"""Request and response bodies of the HTTP API (pydantic; they are the OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictInt, model_validator


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitJob(_Body):
    plan: dict[str, Any] | None = Field(
        default=None, description="The task graph with its settings (docs/plans.md)."
    )
    agent: str | None = Field(
        default=None,
        max_length=200,
        description="Instead of a plan: the name of an agent registered in the server "
        "(@affidavit.agent in its --tools module); `input` holds its keyword arguments.",
    )
    input: Any = Field(default=None, description="The job input (JSON).")
    replay_verification: Literal["strict", "warn", "human"] | None = Field(
        default=None, description="Overrides the plan's mode for this job."
    )
    namespace: str | None = Field(
        default=None, description="Only an admin may submit into another namespace."
    )
    queue: str | None = Field(
        default=None, max_length=128, description="The queue the job waits in (docs/queues.md)."
    )
    priority: StrictInt | None = Field(
        default=None, ge=-(2**31), le=2**31 - 1, description="Lower runs first."
    )
    partition_key: str | None = Field(
        default=None, max_length=256, description="One running job per key (partitioned)."
    )
    not_before: AwareDatetime | None = Field(
        default=None, description="Not claimed before this time (ISO 8601 with a zone)."
    )
    tags: dict[str, str] | None = Field(
        default=None,
        description="Up to 16 `key → value` texts to list the job by (`GET /api/jobs?tag=K=V`); "
        "stored in plain text, never encrypted: they must not hold personal data.",
    )
    subject: str | None = Field(
        default=None,
        max_length=256,
        description="Agent jobs: the person the job's data is about. Every value a person or "
        "an agent supplies to the job is stored sealed under the subject's key, erasable with "
        "`affidavit erase` (docs/privacy.md). Never stored itself: only a keyed hash.",
    )

    @model_validator(mode="after")
    def _plan_or_agent(self) -> SubmitJob:
        if (self.plan is None) == (self.agent is None):
            raise ValueError("give exactly one of `plan` and `agent`")
        return self


class Signal(_Body):
    key: str = Field(description="The wait's correlation key (see the job's trace).")
    payload: Any = Field(default=None, description="The wait node's output.")


class Resume(_Body):
    decision: Literal["retry", "accept_result", "continue", "fail"]
    result: Any = None
    note: str | None = None
    park_version: StrictInt | None = Field(
        default=None,
        ge=1,
        description="Decide only this park: the version of its job_parked event (the trace's "
        "`parked.version`). A job no longer parked by that event is refused (409) and nothing "
        "is written.",
    )


class Fork(_Body):
    from_step: str = Field(
        max_length=256,
        description="The step the reused prefix ends with: a plan node id, an agent step's "
        "`#SEQ` (0-based) or a step id.",
    )
    input: Any = Field(
        default=None,
        description="Replaces the source's input for the steps that run (absent: the source's).",
    )


class Cancel(_Body):
    reason: str | None = Field(default=None, max_length=2000)
    force: bool = Field(
        default=False,
        description="Cancel now even with a tool call in flight: the call is recorded as "
        "`unknown` (the tool may or may not have acted), never as `lost`.",
    )


class Job(BaseModel):
    job_id: str
    namespace: str
    status: str
    plan_name: str | None
    idempotency_key: str | None
    submitted_by: str | None
    created_at: str
    updated_at: str
    event_count: int
    head_hash: str | None
    attempt_id: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    output: Any = None
    error: Any = None
    tags: dict[str, str] | None = Field(
        default=None, description="The job's tags (absent when it has none)."
    )
    parent_job_id: str | None = Field(
        default=None, description="The job that created this one as a child job (ctx.start_job)."
    )
    children: list[str] | None = Field(
        default=None, description="The ids of this job's child jobs, oldest first (up to 1000)."
    )
    unreadable: dict[str, str] | None = Field(
        default=None,
        description="Only when the stored output or error is not JSON (the job row was changed "
        "outside affidavit): each such field, read as null, with why. Absent for a sound job.",
    )
    forked_from: dict[str, Any] | None = Field(
        default=None,
        description="A fork's source job, the step its reused prefix ends with and the hash "
        "of the source's seal. Absent for a job that is no fork.",
    )


class InFlightCall(BaseModel):
    node_id: str
    tool_name: str
    idempotency_key: str
    invocation_id: str


class CancelOutcome(BaseModel):
    state: Literal["cancelled", "requested"] = Field(
        description="`cancelled`: the job ended now. `requested`: a tool call is in flight; it "
        "finishes and its outcome is recorded, then the job ends cancelled."
    )
    waiting_on: Literal["in_flight", "recovery", "parked"] | None = Field(
        description="With `requested`: a live worker finishes the call (`in_flight`), the next "
        "worker resolves the call its dead worker left (`recovery`: reconcile hook or in-flight "
        "policy), or a person resolves the park first (`parked`)."
    )
    request: dict[str, Any] | None
    in_flight: list[InFlightCall]
    abandoned: list[InFlightCall] = Field(
        description="With `force`: the calls recorded as `unknown`."
    )
    message: str


class CancelResult(Job):
    cancel: CancelOutcome


class SignalResult(Job):
    appended: bool = Field(description="False when the key had been signalled already.")


class JobList(BaseModel):
    jobs: list[Job]
    limit: int
    offset: int
    before: str | None = Field(default=None, description="The cursor this page was asked after.")
    next_before: str | None = Field(
        default=None,
        description="On a full page: the cursor of the next one (its last job's id); absent "
        "when fewer jobs than `limit` were listed.",
    )


class Event(BaseModel):
    version: int
    event_id: str
    type: str
    payload: Any
    chain_hash: str


class EventPage(BaseModel):
    events: list[Event]
    next_after_version: int | None = Field(
        description="Pass as after_version for the next page; null when this was the last."
    )


class TraceNode(BaseModel):
    id: str
    type: str
    tool: str | None
    depends_on: list[str]
    step_id: str | None
    state: str
    outcome: str | None
    attempts: int
    started_at: str | None
    finished_at: str | None
    duration_ms: float | None
    tries: list[dict[str, Any]]  # each with its attempt's `worker_id` (null: not recorded)
    # each call of the step a later attempt recovered after the attempt that made it died:
    # {"how": "caught_up"|"rerun"|"lost", "attempt", "worker_id", "at", "version",
    # "rerun_attempt"?, "rerun_worker_id"?, "after"?: "timeout"}
    recovered: list[dict[str, Any]] = []
    output: Any = None
    error: Any = None
    idempotency_key: str | None = None
    correlation_key: str | None = None
    # an agent job's step: its sequence number, when it was called, its arguments' hash, and
    # its waits (correlation key, wait type, since, wake_at, answered_at, signalled_by)
    seq: int | None = None
    called_at: str | None = None
    args_hash: str | None = None
    waits: list[dict[str, Any]] | None = None
    key: str | None = None  # an agent wait or approval step: the key it waits on


class TraceChild(BaseModel):
    job_id: str
    status: str


class Trace(BaseModel):
    job: Job
    kind: Literal["agent"] | None = None  # an agent job: nodes are its steps, in seq order
    agent: dict[str, Any] | None = None  # name, version, agent_hash, policy
    plan_hash: str | None
    policy: dict[str, Any] | None
    nodes: list[TraceNode]
    waiting_for: list[dict[str, Any]]
    parked: dict[str, Any] | None
    warnings: list[dict[str, Any]]
    created_at: str | None
    event_count: int
    input: Any = None  # the job's input, as its job_created recorded it
    # a call of the running job waiting for a limit's grant: {"limit", "since", "reason"}
    waiting_for_limit: dict[str, Any] | None = None
    # a fork's source: {"job_id", "step", "seal_hash"}
    forked_from: dict[str, Any] | None = None
    parent_job_id: str | None = Field(
        default=None, description="The job that created this one as a child job, if any."
    )
    children: list[TraceChild] | None = Field(
        default=None, description="This job's child jobs, oldest first (up to 1000)."
    )
    computed_at: str | None = Field(
        default=None,
        description="When the server computed this answer (RFC 3339, UTC). A sealed job's "
        "answer is computed once and served again: `fresh=1` computes it now.",
    )
    cached: bool | None = Field(
        default=None,
        description="true: the answer kept since `computed_at` for the job's seal, not read "
        "from the store for this request; false: computed for this request.",
    )


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    database: str
    backend: str


class ErrorDetail(BaseModel):
    code: str
    message: str
    hint: str


class ErrorBody(BaseModel):
    error: ErrorDetail


# --- Verification Mode (docs/formats.md §6) and seal keys ----------------------------------------


class LedgerProof(BaseModel):
    ok: bool
    pending_idempotency_keys: list[str]
    unknown_outcome_keys: list[str] | None = Field(
        default=None,
        description="Keys whose invocation was closed as `unknown` (the tool may or may not "
        "have acted: a forced cancel, a job failed with the call in flight). Absent when none.",
    )


class ReplayProof(BaseModel):
    ok: bool
    error: str


class StoredChain(BaseModel):
    ok: bool
    first_bad_version: int | None
    event_count: int


class SealCheck(BaseModel):
    present: bool
    ok: bool
    key_id: str | None
    event_count: int | None
    error: str
    codes: list[str] = Field(
        default_factory=list,
        description="Failures against the transparency log: seal_superseded, log_duplicate.",
    )


class ForkVerification(BaseModel):
    source_job_id: str
    step: str
    status: Literal["verified", "unverified", "failed"]
    problem: str | None = None


class Verification(BaseModel):
    job_id: str
    execution_hash: str
    event_chain_root_hash: str
    tool_invocation_ledger_proof: LedgerProof
    replay_proof_result: ReplayProof
    stored_chain: StoredChain
    seal: SealCheck
    ok: bool
    forked_from: ForkVerification | None = Field(
        default=None,
        description="A fork's reused steps checked against its source's record. Absent for a "
        "job that is no fork.",
    )
    computed_at: str | None = Field(
        default=None,
        description="When the server computed this answer (RFC 3339, UTC). A sealed job's "
        "answer is computed once and served again: `fresh=1` computes it now.",
    )
    cached: bool | None = Field(
        default=None,
        description="true: the answer kept since `computed_at` for the job's seal, not read "
        "from the store for this request; false: computed for this request.",
    )


class SealRecord(BaseModel):
    job_id: str
    event_count: int
    event_chain_root_hash: str
    sealed_at: str
    key_id: str
    algorithm: str
    signature: str = Field(description="Base64 of the Ed25519 signature.")
    version: int | None = Field(
        default=None, description="2 for a seal that also signs `events_root`; absent on v1."
    )
    events_root: str | None = Field(
        default=None,
        description="v2: the RFC 6962 root over the job's events' chain hashes (hex); absent "
        "on v1 (docs/formats.md).",
    )


class JobSeal(BaseModel):
    seal: SealRecord | None = Field(
        description="The job's seal (`verify_events(..., seal=...)` takes it); null when the "
        "job has none (it has not finished, or its seal is gone)."
    )
    error: str | None = Field(
        default=None, description="Why the stored seal row cannot be read (it was edited)."
    )


class SealKey(BaseModel):
    key_id: str
    algorithm: str
    public_key: str = Field(description="Base64 of the raw 32-byte Ed25519 public key.")
    created_at: str | None
    retired_at: str | None


class SealKeys(BaseModel):
    keys: list[SealKey]


# --- what a person decides (the trace page's decision panel) -------------------------------------


class DecisionCaller(BaseModel):
    agent_id: str = Field(description="Who decides: recorded in the log as the decision's author.")
    role: str
    key_id: str | None = Field(default=None, description="The key it decides with (recorded).")
    may_signal: bool = Field(description="The key may signal waits (agent+).")
    may_approve: bool = Field(
        default=False, description="The key may decide approvals (approver or admin)."
    )
    may_resume: bool = Field(description="The key may resume parked jobs (admin).")


class ParkMismatch(BaseModel):
    node_id: str | None
    resource_type: str | None
    resource_id: str | None
    operation: str | None
    recorded: Any = Field(description="The version or ETag the step recorded.")
    observed: Any = Field(description="What the verifier found now (null: it read no version).")
    reason: str | None
    verifier: str | None


class ParkDecision(BaseModel):
    version: int = Field(description="The job_parked event's version: pin it as `park_version`.")
    reason: str
    since: str | None
    decisions: list[str] = Field(description="What `resume` accepts for this park.")
    node_id: str | None
    step_id: str | None
    tool: str | None
    args: Any = Field(description="The tool's arguments, resolved as the step ran them.")
    args_error: str | None = None
    idempotency_key: str | None
    external_key: str | None = Field(description="The key the tool was given to pass downstream.")
    message: str | None
    reconcile: dict[str, Any] | None = Field(
        default=None,
        description="In-flight parks: `hook` (the tool has a reconcile hook, which failed) and "
        "its `error`; `hook: false` when the tool has none.",
    )
    mismatches: list[ParkMismatch] | None = None
    recorded_result: Any = None
    detail: dict[str, Any] | None = None


class WaitDecision(BaseModel):
    node_id: str
    wait_type: str
    correlation_key: str
    since: str | None
    payload: Any = Field(description="The node's args resolved: what the plan attached.")
    payload_error: str | None = None
    approvers: list[str] | None = Field(
        default=None, description="Approvals: the roles and principals that may decide it."
    )
    min_approvals: int | None = Field(
        default=None, description="Approvals: distinct approvals that grant it."
    )
    approvals: list[dict[str, Any]] | None = Field(
        default=None, description="Approvals: the decisions recorded so far."
    )
    call: dict[str, Any] | None = Field(
        default=None,
        description="The approval of a tool's call: its step_id, tool_name, args_hash, args.",
    )
    may_decide: bool = Field(default=False, description="This caller may decide this wait.")
    why_not: str | None = Field(default=None, description="Why it may not, when it may not.")


class Decisions(BaseModel):
    job_id: str
    status: str
    version: int
    park: ParkDecision | None
    waits: list[WaitDecision]
    caller: DecisionCaller


# --- data subjects and their erasure (docs/privacy.md) ------------------------------------------


class Subject(BaseModel):
    subject_id: str = Field(
        description="The subject's keyed hash: the subject itself is never kept."
    )
    key_id: str = Field(description="The id of the subject's data key.")
    created_at: str
    jobs: int = Field(description="How many jobs were submitted for the subject.")
    first_used: str | None
    last_used: str | None
    erased_at: str | None = Field(description="When the subject was erased (null: it is not).")
    erase_reason: str | None


class SubjectList(BaseModel):
    subjects: list[Subject]
    limit: int
    after: str | None = Field(default=None, description="The cursor this page was asked after.")
    next_after: str | None = Field(
        default=None,
        description="On a full page: the cursor of the next one (its last subject's id); "
        "absent when fewer subjects than `limit` were listed.",
    )


class SubjectDetail(Subject):
    job_ids: list[str] = Field(description="The subject's jobs, oldest first.")


class EraseSubject(_Body):
    reason: str | None = Field(
        default=None,
        max_length=1000,
        description="Why (recorded in the signed receipt, in plain text: no personal data).",
    )


class ErasureReceiptBody(BaseModel):
    subject_id: str
    data_key_id: str | None
    erased_at: str
    job_ids: list[str]
    reason: str | None
    key_id: str = Field(description="The seal key that signed the receipt.")


class ErasureReceipt(BaseModel):
    type: Literal["affidavit.erasure_receipt/v1"]
    receipt: ErasureReceiptBody
    signature: str = Field(description="Standard base64 of the Ed25519 signature.")
    tlog_proof: str | None = Field(
        description="The receipt's c2sp.org/tlog-proof@v1 once the log integrated it."
    )


class Erasure(BaseModel):
    receipt: ErasureReceipt = Field(
        description="The signed receipt: save it as a file for `affidavit erase verify FILE`."
    )
    erased_now: bool = Field(description="False: the subject was erased before (same receipt).")
    scrubbed: bool = Field(
        description="False: the database could not drop every copy of the key yet: erase again."
    )
    cancelled: list[str] = Field(
        default_factory=list,
        description="The subject's jobs this erasure cancelled first (they had not finished).",
    )
