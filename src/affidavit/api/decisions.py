"""``GET /api/jobs/{id}/decisions``: what a person is asked to decide about a job, and what the
caller's key may decide (the trace page's decision panel draws from it). The decisions
themselves are ``/signal`` and ``/resume`` (:mod:`affidavit.api.jobs`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from affidavit.api.deps import Observer, ServiceDep, visible_job
from affidavit.api.jobs import ERRORS
from affidavit.api.models import Decisions
from affidavit.core.approvals import ApprovalPolicy
from affidavit.record import decision_context

router = APIRouter(prefix="/api/jobs", tags=["jobs"], responses=ERRORS)


@router.get("/{job_id}/decisions", response_model=Decisions, response_model_exclude_unset=True)
def decisions(job_id: str, svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """The park in force (tool, resolved arguments, idempotency keys, what reconcile found,
    the mismatches confirmation saw, the decisions its reason allows, the `version` to pin)
    and the open waits (an approval's attached payload, who may decide it and what was decided
    so far), with what the caller may decide: `may_signal` (waits: role agent or above),
    `may_approve` (approvals: approver or admin), `may_resume` (admin), and per wait
    `may_decide` (with `why_not`: the submitter of a job decides none of its approvals). 404
    for an unknown job or one of another namespace."""
    job = visible_job(svc.store, caller, job_id)
    found = decision_context(svc.store, job_id)
    found["caller"] = {
        "agent_id": caller.agent_id,
        "role": caller.role,
        "key_id": caller.key_id,
        "may_signal": caller.has("agent"),
        "may_approve": caller.has("approver"),
        "may_resume": caller.has("admin"),
    }
    for wait in found["waits"]:
        if wait["wait_type"] == "approval":
            why = ApprovalPolicy.recorded(wait).why_not(caller.principal, job.submitted_by)
        else:
            why = None if caller.has("agent") else "signals need a key of role agent or above"
        wait["may_decide"] = why is None
        if why is not None:
            wait["why_not"] = why
    return found
