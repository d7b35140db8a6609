"""``/api/subjects``: the data subjects whose jobs' values are sealed, and their erasure
(docs/privacy.md) — the service functions of ``affidavit subjects`` and ``affidavit erase``.

Every route is for admin keys. A subject spans namespaces, and which subjects had jobs, how
many and when is itself about people: an agent that submits for a subject, an observer or an
approver of one namespace has no business listing them. The subject in the path is the one
given to submit (it is hashed under the master key to find the subject's id; never stored)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from affidavit.api.deps import Admin, ServiceDep
from affidavit.api.models import EraseSubject, Erasure, ErrorBody, SubjectDetail, SubjectList
from affidavit.privacy import erase, list_subjects, show_subject
from affidavit.record import Sealer

router = APIRouter(
    prefix="/api/subjects",
    tags=["subjects"],
    responses={code: {"model": ErrorBody} for code in (401, 403, 404, 409, 413, 422, 429, 503)},
)


@router.get("", response_model=SubjectList)
def subjects(svc: ServiceDep, caller: Admin) -> dict[str, Any]:
    """Every subject, oldest first: its id (a keyed hash), jobs count, first and last use,
    erasure — never the subject itself, nor any value of its jobs. Admin keys only."""
    return {"subjects": list_subjects(svc.store)}


# (`:path`: a subject may hold a `/`, sent as `%2F`; the erase route below is matched first)
@router.post("/{subject:path}/erase", response_model=Erasure)
def erase_subject(
    subject: str, svc: ServiceDep, caller: Admin, body: EraseSubject | None = None
) -> dict[str, Any]:
    """Erase a subject, as `affidavit erase --subject S` does: its data key is destroyed, so
    the values its jobs hold sealed can never be read again, while every proof still
    verifies. Answers the signed erasure receipt (`receipt`, for `affidavit erase verify`),
    also queued for the transparency log. Refused with 409 (`subject_busy`), nothing
    changed, while a job of the subject is not finished: cancel it or let it end first. 404
    (`subject_not_found`) for a subject no job was submitted for; 422 for a malformed subject
    or reason. Erasing again answers the same receipt (`erased_now: false`) and retries the
    scrub of the database's files (`scrubbed`). Admin keys only."""
    reason = body.reason if body is not None else None
    done = erase(svc.store, subject, sealer=Sealer.for_store(svc.store), reason=reason)
    return done.to_dict()


@router.get("/{subject:path}", response_model=SubjectDetail)
def subject_detail(subject: str, svc: ServiceDep, caller: Admin) -> dict[str, Any]:
    """One subject: its id, jobs count and job ids, first and last use, erasure. 404
    (`subject_not_found`) for a subject no job was submitted for; 422 for a malformed one.
    Needs the server's master key (the subject is found by its keyed hash). Admin keys only."""
    return show_subject(svc.store, subject)
