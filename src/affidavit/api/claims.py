"""``/api/claims`` and ``/api/agents``: verify a claim by running its check (the verifier is
the caller's agent), and read agents' trust, evidence and trust logs. Each route calls
:class:`~affidavit.claims.ClaimService`, as the CLI does."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from affidavit.api.deps import Admin, AgentRole, Observer, Service, ServiceDep
from affidavit.api.jobs import ERRORS
from affidavit.claims import ClaimService
from affidavit.claims.made import Claim, ClaimNotFound
from affidavit.claims.model import Agent, ClaimType
from affidavit.core.errors import AgentNotFound, ValidationError
from affidavit.faces.auth import Caller

router = APIRouter(tags=["claims"], responses=ERRORS)


class VerifyClaim(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: str = Field(description="The claimant.", min_length=1, max_length=128)
    claim_type: ClaimType
    claim: dict[str, Any] = Field(
        description="The claim: return_code, output_contains, metrics (+ tolerance, parser), "
        "exact_match, pattern_id (docs/claims.md)."
    )
    command: str = Field(description="The check to run (allow-listed, no shell).", min_length=1)
    timeout_s: float | None = Field(default=None, gt=0, le=600)


class ClaimVerdict(BaseModel):
    accurate: bool
    verdict: str
    decided_by: str
    claim: dict[str, Any]
    actual: dict[str, Any]
    verification_id: str
    evidence_id: str
    new_trust_score: float
    propagation: dict[str, Any]
    counted: bool = Field(
        description="This verification moved trust (a claim moves it once: false for a "
        "re-verification and for an error)."
    )
    disagrees: bool = Field(
        description="A re-verification judged otherwise than the verification that counted."
    )


class AgentTrust(BaseModel):
    agent_id: str
    namespace: str
    role: str
    trust_score: float
    requires_verification: bool
    reliable: bool
    verifications: int
    accurate_verifications: int
    error_verifications: int
    created_at: str
    updated_at: str


class TrustLogEntry(BaseModel):
    version: int
    entry_id: str
    type: str
    payload: Any
    chain_hash: str


def _visible_agent(service: ClaimService, caller: Caller, agent_id: str) -> Agent:
    """The agent, if the caller may see its namespace (else "not found", like a missing one)."""
    agent = service.get_agent(agent_id)
    if not caller.sees(agent.namespace):
        raise AgentNotFound(agent_id)
    return agent


class MakeClaim(BaseModel):
    model_config = ConfigDict(extra="forbid")

    claim_type: ClaimType
    claim: dict[str, Any] = Field(
        description="What the caller's agent claims: return_code, output_contains, metrics "
        "(+ tolerance, parser), exact_match, pattern_id (docs/claims.md)."
    )
    command: str = Field(
        description="The check that proves it (allow-listed, no shell).", min_length=1
    )


class MadeClaim(BaseModel):
    claim_id: str
    agent_id: str
    namespace: str
    claim_type: str
    claim: dict[str, Any]
    command: str
    created_at: str


class ClaimCheck(BaseModel):
    verification_id: str | None
    verdict: str | None
    decided_by: str | None
    verifier_id: str | None
    at: str | None
    trust_log_version: int
    counted: bool
    disagrees: bool


class ClaimView(MadeClaim):
    verifications: list[ClaimCheck] = Field(
        description="Oldest first: `counted` marks the one that moved trust; `disagrees` "
        "flags a re-verification judged otherwise."
    )
    disagreements: int


class VerifyMadeClaim(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(default=None, gt=0, le=600)


def _visible_claim(service: ClaimService, caller: Caller, claim_id: str) -> Claim:
    claim = service.get_claim(claim_id)
    if not caller.sees(claim.namespace):
        raise ClaimNotFound(f"claim {claim_id!r} not found")
    return claim


@router.post("/api/claims", response_model=MadeClaim, status_code=201)
def make_claim(body: MakeClaim, svc: ServiceDep, caller: AgentRole) -> dict[str, Any]:
    """Record a claim of the caller's own agent (the key's `--agent`, registered with
    `affidavit agents add`) and the command that checks it → its `claim_id`. Nothing runs
    until another agent verifies it (`POST /api/claims/{id}/verify`)."""
    service = ClaimService(svc.store, sandbox=svc.sandbox)
    return service.make_claim(caller.agent_id, body.claim_type, body.claim, body.command).to_dict()


@router.get("/api/claims/{claim_id}", response_model=ClaimView)
def get_claim(claim_id: str, svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """A recorded claim (another namespace's is not found) and its verifications: the one that
    moved trust, and the re-verifications flagged because they judged it otherwise."""
    service = ClaimService(svc.store, sandbox=svc.sandbox)
    _visible_claim(service, caller, claim_id)
    return service.claim_view(claim_id)


@router.post("/api/claims/{claim_id}/verify", response_model=ClaimVerdict)
async def verify_made_claim(
    claim_id: str, body: VerifyMadeClaim, svc: ServiceDep, caller: AgentRole
) -> dict[str, Any]:
    """Judge a recorded claim by running its command; the caller's agent is the verifier
    (never the claimant: 403; of the claimant's namespace unless admin). No free claim slot:
    429 (the agent's) or 503 (the server's), with Retry-After."""
    service = ClaimService(svc.store, sandbox=svc.sandbox)
    timeout = claim_timeout(svc, service, body.timeout_s)

    def run() -> dict[str, Any]:
        _visible_claim(service, caller, claim_id)
        return service.verify_made_claim(claim_id, caller.agent_id, timeout_s=timeout).to_dict()

    return await svc.claims.run(caller.agent_id, run)


@router.post("/api/claims/verify", response_model=ClaimVerdict)
async def verify_claim(body: VerifyClaim, svc: ServiceDep, caller: Admin) -> dict[str, Any]:
    """Admins only: judge a claim whose content the caller supplies for `agent_id` (an agent
    records its own claims with `POST /api/claims`; a plain agent key gets 403 here, so no
    agent can write what another claimed). A refused claim runs nothing: 403/422; no free
    claim slot: 429 or 503, with Retry-After."""
    service = ClaimService(svc.store, sandbox=svc.sandbox)
    timeout = claim_timeout(svc, service, body.timeout_s)

    def run() -> dict[str, Any]:
        _visible_agent(service, caller, body.agent_id)
        return service.verify_claim(
            body.agent_id,
            body.claim_type,
            body.claim,
            body.command,
            caller.agent_id,
            timeout_s=timeout,
        ).to_dict()

    return await svc.claims.run(caller.agent_id, run)


def claim_timeout(svc: Service, service: ClaimService, asked: float | None) -> float:
    """The claim's timeout: what it asks for (at most the operator's cap), else the default.

    Raises:
        ValidationError: it asks for more than the cap.
    """
    cap = svc.claims.limits.max_timeout_s
    if asked is not None and asked > cap:
        raise ValidationError(
            f"timeout_s {asked:g} is above this server's limit of {cap:g} seconds",
            hint="Ask for a shorter timeout; the operator sets the cap (--claim-max-timeout).",
        )
    return min(asked if asked is not None else service.sandbox.timeout_s, cap)


@router.get("/api/agents/{agent_id}/trust", response_model=AgentTrust)
def trust(agent_id: str, svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """The agent's trust score, whether it still requires verification, and its counters."""
    service = ClaimService(svc.store)
    return service.agent_dict(_visible_agent(service, caller, agent_id))


@router.get("/api/agents/{agent_id}/verifications", response_model=list[dict[str, Any]])
def verifications(
    agent_id: str,
    svc: ServiceDep,
    caller: Observer,
    claim_type: ClaimType | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """The agent's evidence records, newest first."""
    service = ClaimService(svc.store)
    _visible_agent(service, caller, agent_id)
    return service.get_verification_history(agent_id, claim_type, limit)


@router.get("/api/agents/{agent_id}/verification-stats", response_model=dict[str, Any])
def verification_stats(agent_id: str, svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """Totals, accuracy, by claim type, the last 10."""
    service = ClaimService(svc.store)
    _visible_agent(service, caller, agent_id)
    return service.get_verification_statistics(agent_id)


@router.get("/api/agents/{agent_id}/trust-history", response_model=list[TrustLogEntry])
def trust_history(agent_id: str, svc: ServiceDep, caller: Observer) -> list[dict[str, Any]]:
    """The agent's hash-chained trust log, oldest first."""
    service = ClaimService(svc.store)
    _visible_agent(service, caller, agent_id)
    return [e.to_dict() for e in service.get_trust_history(agent_id)]
