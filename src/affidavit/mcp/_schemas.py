"""The ``outputSchema`` of each ``affidavit mcp`` tool: the fields a client may rely on, typed;
a document may carry more (``additionalProperties``), as the HTTP API's models do."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class JobVerification(_Open):
    """The ``affidavit verify --json`` document of one job."""

    job_id: str
    ok: bool = Field(description="The verdict: every check passed.")
    execution_hash: str
    event_chain_root_hash: str
    tool_invocation_ledger_proof: dict[str, Any]
    replay_proof_result: dict[str, Any]
    stored_chain: dict[str, Any]
    seal: dict[str, Any]


class ExportedPack(_Open):
    job_id: str
    filename: str
    archive_sha256: str
    archive_bytes: int
    pack_root_sha256: str
    assay_diverging_steps: list[str]
    archive_base64: str = Field(description="The .tar.gz of GET /api/jobs/{id}/pack, base64.")


class PackVerification(_Open):
    verdict: str = Field(description="MATCH, DIVERGE or INTEGRITY_FAIL.")
    ok: bool
    exit_code: int = Field(description="`affidavit pack verify`'s: 0, 1 or 2.")
    phase: int
    errors: list[str]
    receipt: dict[str, Any] = Field(description="The replay-result receipt.")


class ClaimVerdict(_Open):
    """The ``claims verify --json`` document (docs/formats.md §9)."""

    accurate: bool
    verdict: str = Field(description="accurate, inaccurate or error.")
    decided_by: str


class Trust(_Open):
    agent_id: str
    namespace: str
    role: str
    trust_score: float
    requires_verification: bool
    reliable: bool
    verifications: int


class Job(_Open):
    """A job, as GET /api/jobs/{id} gives it."""

    job_id: str
    namespace: str
    status: str
    plan_name: str | None
    submitted_by: str | None
    created_at: str
    updated_at: str
    event_count: int
    output: Any = None
    error: Any = None


class JobList(_Open):
    jobs: list[Job]
    limit: int
    next_before: str | None = Field(
        default=None, description="The `before` of the next page; absent on the last page."
    )


class Submitted(Job):
    created: bool = Field(description="False: the idempotency key had given this job already.")


class Signalled(Job):
    appended: bool = Field(
        description="False when the key had been signalled (or this principal had decided) "
        "already: nothing was written."
    )
