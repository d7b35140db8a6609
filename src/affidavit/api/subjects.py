"""``/api/subjects``: the data subjects whose jobs' values are sealed, and their erasure
(docs/privacy.md) — the service functions of ``affidavit subjects`` and ``affidavit erase``.

Every route is for admin keys. A subject spans namespaces, and which subjects had jobs, how
many and when is itself about people: an agent that submits for a subject, an observer or an
approver of one namespace has no business listing them. The subject in the path is the one
given to submit (it is hashed under the master key to find the subject's id; never stored)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from affidavit.api.deps import Admin, ServiceDep
from affidavit.api.models import EraseSubject, Erasure, ErrorBody, SubjectDetail, SubjectList
from affidavit.privacy import erase, list_subjects, show_subject
from affidavit.record import Sealer
from affidavit.runtime import erasure_cancel

DEFAULT_PAGE = 1000
MAX_PAGE = 10_000
router = APIRouter(
    prefix="/api/subjects",
    tags=["subjects"],
    responses={code: {"model": ErrorBody} for code in (401, 403, 404, 409, 413, 422, 429, 503)},
)


@router.get("", response_model=SubjectList, response_model_exclude_unset=True)
def subjects(
    svc: ServiceDep,
    caller: Admin,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    after: Annotated[
        str | None,
        Query(
            max_length=64,
            description="A subject id: list the subjects after it (a page's `next_after`).",
        ),
    ] = None,
) -> dict[str, Any]:
    """The subjects, oldest first, a page at a time: each one's id (a keyed hash), jobs
    count, first and last use, erasure — never the subject itself, nor any value of its
    jobs. A full page names the cursor of the next (`next_after`). Admin keys only."""
    rows = list_subjects(svc.store, after=after, limit=limit)
    page: dict[str, Any] = {"subjects": rows, "limit": limit}
    if after is not None:
        page["after"] = after
    if len(rows) == limit:
        page["next_after"] = rows[-1]["subject_id"]
    return page


# (`:path`: a subject may hold a `/`, sent as `%2F`; the erase route below is matched first)
@router.post("/{subject:path}/erase", response_model=Erasure)
def erase_subject(
    subject: str, svc: ServiceDep, caller: Admin, body: EraseSubject | None = None
) -> dict[str, Any]:
    """Erase a subject, as `affidavit erase --subject S` does: its data key is destroyed, so
    the values its jobs hold sealed can never be read again, while every proof still
    verifies. Answers the signed erasure receipt (`receipt`, for `affidavit erase verify`),
    also queued for the transparency log. A job of the subject that is not finished is
    cancelled first (`cancelled` lists them); one with a tool call in flight finishes that
    call and records its outcome first: until it has ended the erasure is refused with 409
    (`subject_busy`), its cancel requested — erase again then. 404
    (`subject_not_found`) for a subject no job was submitted for; 422 for a malformed subject
    or reason. Erasing again answers the same receipt (`erased_now: false`) and retries the
    scrub of the database's files (`scrubbed`). Admin keys only."""
    reason = body.reason if body is not None else None
    sealer = Sealer.for_store(svc.store)
    cancel = erasure_cancel(svc.store, by=caller.agent_id, sealer=sealer)
    done = erase(svc.store, subject, sealer=sealer, reason=reason, cancel=cancel)
    return done.to_dict()


@router.get("/{subject:path}", response_model=SubjectDetail)
def subject_detail(subject: str, svc: ServiceDep, caller: Admin) -> dict[str, Any]:
    """One subject: its id, jobs count and job ids, first and last use, erasure. 404
    (`subject_not_found`) for a subject no job was submitted for; 422 for a malformed one.
    Needs the server's master key (the subject is found by its keyed hash). Admin keys only."""
    return show_subject(svc.store, subject)
