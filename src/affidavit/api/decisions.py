"""``GET /api/jobs/{id}/decisions``: what a person is asked to decide about a job, and what the
caller's key may decide (the trace page's decision panel draws from it). The decisions
themselves are ``/signal`` and ``/resume`` (:mod:`affidavit.api.jobs`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from affidavit.api.deps import Observer, ServiceDep, visible_job
from affidavit.api.jobs import ERRORS
from affidavit.api.models import Decisions
from affidavit.runtime import decision_context

router = APIRouter(prefix="/api/jobs", tags=["jobs"], responses=ERRORS)


@router.get("/{job_id}/decisions", response_model=Decisions, response_model_exclude_unset=True)
def decisions(job_id: str, svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """The park in force (tool, resolved arguments, idempotency keys, what reconcile found,
    the mismatches confirmation saw, the decisions its reason allows, the `version` to pin)
    and the open waits (an approval's attached payload), with what the caller may decide:
    `may_signal` (role agent or above), `may_resume` (admin). 404 for an unknown job or one
    of another namespace."""
    visible_job(svc.store, caller, job_id)
    found = decision_context(svc.store, job_id)
    found["caller"] = {
        "agent_id": caller.agent_id,
        "role": caller.role,
        "may_signal": caller.has("agent"),
        "may_resume": caller.has("admin"),
    }
    return found
