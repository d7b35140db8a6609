"""``/api/jobs``: submit, list, read, trace, and the human decisions. Each route calls the same
service function as the CLI."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from affidavit.api.deps import (
    Admin,
    AgentRole,
    Observer,
    ServiceDep,
    check_verifiable,
    check_visible,
    visible_job,
)
from affidavit.api.models import (
    Cancel,
    CancelResult,
    ErrorBody,
    EventPage,
    Fork,
    Job,
    JobList,
    JobSeal,
    Resume,
    Signal,
    SignalResult,
    SubmitJob,
    Trace,
    Verification,
)
from affidavit.api.sealed import sealed_key, serve_bytes, serve_json, source_seal_part
from affidavit.faces.auth import Forbidden, check_namespace
from affidavit.packs import export_archive
from affidavit.record import (
    SubjectView,
    family_doc,
    fork_lineage,
    job_trace,
    seal_document,
    shown_job,
)
from affidavit.runtime import (
    registry,
    request_cancel,
    require_queue,
    resume_job,
    signal_job,
    submit_agent_job,
    submit_fork,
    submit_job,
    valid_traceparent,
)
from affidavit.store import JOB_STATUSES, JobFilter
from affidavit.store.queues import placement
from affidavit.store.tags import read_tags, tag_filter, with_tags
from affidavit.verify import verification_document, verify_one_fork
from affidavit.verify.verification import check_trusted_keys

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 403, 404, 409, 413, 422, 429, 503)
}
router = APIRouter(prefix="/api/jobs", tags=["jobs"], responses=ERRORS)

MAX_INT = 2**53  # the largest integer every JSON reader and both databases hold exactly
# A pack whose traces hold exponent-form numbers (1e-7), which assay's verifier reports as
# diverging: how many steps, and the first ASSAY_STEPS_LISTED of their ids (a header stays short)
ASSAY_DIVERGING_COUNT = "X-Affidavit-Assay-Diverging-Count"
ASSAY_DIVERGING_STEPS = "X-Affidavit-Assay-Diverging-Steps"
ASSAY_STEPS_LISTED = 50
FreshQuery = Annotated[
    bool,
    Query(
        description="Compute the answer again from the store as it is now, instead of serving "
        "the one kept for the job's seal (which says when it was computed)."
    ),
]
StatusQuery = Annotated[
    list[str] | None, Query(description=f"Any of: {', '.join(JOB_STATUSES)}; repeatable.")
]


@router.post("", status_code=201, response_model=Job, response_model_exclude_unset=True)
def submit(
    body: SubmitJob,
    svc: ServiceDep,
    caller: AgentRole,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="The same key returns the same job.",
            max_length=200,
        ),
    ] = None,
    traceparent: Annotated[
        str | None,
        Header(
            description="A W3C trace context: recorded with the job, whose spans join that "
            "trace. A malformed one is ignored, as W3C Trace Context says.",
        ),
    ] = None,
) -> dict[str, Any]:
    """Validate and enqueue a job in the caller's namespace (201); with an `Idempotency-Key`
    already used there, the existing job (200). Nothing is written for an invalid plan or
    input (422)."""
    namespace = check_namespace(body.namespace or caller.namespace)
    if namespace != caller.namespace and caller.role != "admin":
        raise Forbidden(f"only an admin may submit into namespace {namespace!r}")
    where = placement(
        body.queue,
        priority=body.priority,
        partition_key=body.partition_key,
        not_before=body.not_before,
    )
    if where is not None:
        require_queue(svc.store, where.queue)
    if body.agent is not None:
        job, created = submit_agent_job(
            svc.store,
            body.agent,
            body.input,
            tools=svc.tools if svc.tools is not None else registry,
            idempotency_key=idempotency_key,
            namespace=namespace,
            submitted_by=caller.agent_id,
            replay_verification=body.replay_verification,
            traceparent=traceparent if valid_traceparent(traceparent) else None,
            placement=where,
            tags=body.tags,
            subject=body.subject,
        )
        if not created:
            response.status_code = 200
        return with_tags(svc.store, shown_job(svc.store, job).to_dict())
    assert body.plan is not None  # (the body's validator)
    job, created = submit_job(
        svc.store,
        body.plan,
        body.input,
        tools=svc.tools,
        idempotency_key=idempotency_key,
        namespace=namespace,
        submitted_by=caller.agent_id,
        replay_verification=body.replay_verification,
        traceparent=traceparent if valid_traceparent(traceparent) else None,
        placement=where,
        tags=body.tags,
        subject=body.subject,
    )
    if not created:
        response.status_code = 200
    return with_tags(svc.store, shown_job(svc.store, job).to_dict())


@router.get("", response_model=JobList, response_model_exclude_unset=True)
def list_jobs(
    svc: ServiceDep,
    caller: Observer,
    status: StatusQuery = None,
    namespace: Annotated[str | None, Query(description="Admins: any namespace.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    before: Annotated[
        str | None,
        Query(
            description="A job id: only the jobs listed after it (the keyset cursor; "
            "`next_before` of the previous page)."
        ),
    ] = None,
    parent: Annotated[str | None, Query(description="Only the child jobs of this job.")] = None,
    tag: Annotated[
        list[str] | None,
        Query(
            description="`KEY=VALUE`: only the jobs with this tag; repeatable (every one must "
            "match)."
        ),
    ] = None,
) -> dict[str, Any]:
    """Jobs of the caller's namespace (an admin's: every namespace, or `namespace`), newest
    first; a full page names the cursor of the next one (`next_before`)."""
    if namespace is not None:
        check_namespace(namespace)
    if caller.role != "admin":
        if namespace is not None and namespace != caller.namespace:
            raise Forbidden(f"namespace {namespace!r} is not yours")
        namespace = caller.namespace
    if before is not None:
        visible_job(svc.store, caller, before)  # another namespace's job: not found
    jobs = svc.store.list_jobs(
        JobFilter(
            status=status,
            namespace=namespace,
            limit=limit,
            offset=offset,
            before=before,
            parent=parent,
            tags=tag_filter(tag or ()),
        )
    )
    tags = read_tags(svc.store, [j.job_id for j in jobs])
    jobs = [shown_job(svc.store, j) for j in jobs]  # a subject's: opened, or erased
    page: dict[str, Any] = {
        "jobs": [
            j.to_dict() | ({"tags": tags[j.job_id]} if j.job_id in tags else {}) for j in jobs
        ],
        "limit": limit,
        "offset": offset,
    }
    if before is not None:
        page["before"] = before
    if len(jobs) == limit:
        page["next_before"] = jobs[-1].job_id
    return page


@router.get("/{job_id}", response_model=Job, response_model_exclude_unset=True)
def get_job(job_id: str, svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    job = shown_job(svc.store, visible_job(svc.store, caller, job_id))
    doc = with_tags(svc.store, job.to_dict()) | family_doc(svc.store, job_id)
    lineage = fork_lineage(svc.store.list_events(job_id, limit=1))
    return doc if lineage is None else {**doc, "forked_from": lineage}


@router.post(
    "/{job_id}/fork", status_code=201, response_model=Job, response_model_exclude_unset=True
)
def fork(
    job_id: str,
    body: Fork,
    svc: ServiceDep,
    caller: Admin,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="The same key returns the same fork.",
            max_length=200,
        ),
    ] = None,
) -> dict[str, Any]:
    """A new job (201) that reuses the finished job's recorded steps up to and including
    `from_step` and runs the rest with the tools deployed now; `input` replaces the input of
    the steps that run. With an `Idempotency-Key` already used in the source's namespace, the
    fork it made (200) — for another source, step or input, a refusal (409,
    `idempotency_conflict`). A job with no seal yet, or a step it did not complete, is refused
    (409, `fork_refused`) and nothing is written."""
    visible_job(svc.store, caller, job_id)
    given = "input" in body.model_fields_set
    job, created = submit_fork(
        svc.store,
        job_id,
        body.from_step,
        *((body.input,) if given else ()),
        submitted_by=caller.agent_id,
        tools=svc.tools,
        idempotency_key=idempotency_key,
    )
    if not created:
        response.status_code = 200
    lineage = fork_lineage(svc.store.list_events(job.job_id, limit=1))
    return {**shown_job(svc.store, job).to_dict(), "forked_from": lineage}


@router.get("/{job_id}/events", response_model=EventPage)
def events(
    job_id: str,
    svc: ServiceDep,
    caller: Observer,
    after_version: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    raw: bool = False,
) -> dict[str, Any]:
    """The log in version order, a page at a time, each event with its chain hash. A job
    with a subject shows its sealed values opened while the subject's key exists, and
    `"[erased]"` after; `raw=true` gives the stored envelopes (what the chain covers)."""
    job = visible_job(svc.store, caller, job_id)
    page = svc.store.list_events(job_id, after_version=after_version, limit=limit)
    more = bool(page) and page[-1].version < job.version
    view = None if raw else SubjectView(svc.store, job_id)
    return {
        "events": [e.to_dict() if view is None else view.event_dict(e) for e in page],
        "next_after_version": page[-1].version if more else None,
    }


@router.get("/{job_id}/trace", response_model=Trace, response_model_exclude_unset=True)
def trace(job_id: str, svc: ServiceDep, caller: Observer, fresh: FreshQuery = False) -> Response:
    """Each node with its state, outcome, attempts and timings; the waits and the park. A
    sealed job's trace is computed once and served again (`cached`, `computed_at`)."""
    key = sealed_key(svc.store, caller, job_id)
    return serve_json(
        svc.sealed,
        None if key is None else ("trace", job_id, *key),
        Trace,
        lambda: job_trace(svc.store, job_id),
        fresh=fresh,
    )


@router.get("/{job_id}/verify", response_model=Verification, response_model_exclude_unset=True)
def verify(
    job_id: str,
    svc: ServiceDep,
    caller: Observer,
    trusted_key: Annotated[
        list[str] | None,
        Query(
            description="Pin the keys the seal may be signed with (repeatable): a raw Ed25519 "
            "public key in base64, as `affidavit keys show` prints it, or the key id of a key "
            "recorded in the database. Without it, any key recorded in the database is "
            "accepted.",
        ),
    ] = None,
    fresh: FreshQuery = False,
) -> Response:
    """Verification Mode (read-only, any status): execution hash, event chain root, ledger
    proof, replay proof, stored chain, seal. 200 whatever the verdict (see `ok`); 404 for an
    unknown job or one of another namespace; 422 for a `trusted_key` that is no key. A job id
    whose job row is gone but whose events, ledger rows or seal remain gets the result of
    those (failing, `orphan`), as `affidavit verify` reports it — for an admin key only: such
    records name no namespace. A fork's `forked_from` checks its reused steps against the
    source's record: `verified`, `unverified` (the source is not in this database; `ok` is
    not failed for it) or `failed` (then `ok` is false). A sealed job's result is computed once
    (for the same keys) and served again, saying so (`cached`, `computed_at`): `fresh=1`
    verifies the store as it is now."""
    if trusted_key:
        check_trusted_keys(svc.store, trusted_key)  # a bad key is an error, job or not
    check_verifiable(svc.store, caller, job_id)
    key = sealed_key(svc.store, caller, job_id, orphans=True, keys=True)
    if key is not None:  # a fork's verdict also depends on its source's seal
        source = source_seal_part(svc.store, job_id)
        key = None if source is None else (*key, source)
    pinned = tuple(sorted(set(trusted_key or ())))

    def compute() -> dict[str, Any]:
        result, fork = verify_one_fork(svc.store, job_id, trusted_keys=trusted_key or None)
        return verification_document(result, fork)

    return serve_json(
        svc.sealed,
        None if key is None else ("verify", job_id, *key, *pinned),
        Verification,
        compute,
        fresh=fresh,
    )


@router.get("/{job_id}/seal", response_model=JobSeal, response_model_exclude_unset=True)
def seal(job_id: str, svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """The job's seal, for verifying its log offline with `verify_events` (with the events of
    `/events` and a key of `/api/keys`); `seal` is null when the job has none. 404 for an
    unknown job or one of another namespace."""
    check_visible(svc.store, caller, job_id)
    return seal_document(svc.store, job_id)


@router.get(
    "/{job_id}/pack",
    response_class=Response,
    responses={200: {"content": {"application/gzip": {}}, "description": "a .tar.gz"}},
)
def pack(job_id: str, svc: ServiceDep, caller: Observer, fresh: FreshQuery = False) -> Response:
    """The finished job as a signed RCE v0.1 proof pack: a `.tar.gz` of the pack directory
    `affidavit pack export` writes (verify it offline with `affidavit pack verify`). 404 for an
    unknown job or one of another namespace; 409 for a job that has not finished. A sealed
    job's pack is made once and served again (headers `X-Affidavit-Cached`,
    `X-Affidavit-Computed-At`); `fresh=1` makes it again from the store as it is now."""
    key = sealed_key(svc.store, caller, job_id)

    def make() -> tuple[bytes, dict[str, str]]:
        data, result = export_archive(svc.store, job_id)
        headers = {"Content-Disposition": f'attachment; filename="pack-{job_id}.tar.gz"'}
        steps = result.assay_diverging_steps
        if steps:  # what `affidavit pack export` notes on stderr (docs/api.md)
            headers[ASSAY_DIVERGING_COUNT] = str(len(steps))
            headers[ASSAY_DIVERGING_STEPS] = ",".join(steps[:ASSAY_STEPS_LISTED])
        return data, headers

    return serve_bytes(
        svc.sealed,
        None if key is None else ("pack", job_id, *key),
        "application/gzip",
        make,
        fresh=fresh,
    )


@router.post("/{job_id}/signal", response_model=SignalResult, response_model_exclude_unset=True)
def signal(job_id: str, body: Signal, svc: ServiceDep, caller: Observer) -> dict[str, Any]:
    """Complete a wait (role agent or above), or decide an approval (role approver or admin,
    not the job's submitter, among the approval's `approvers`; the payload exactly
    `{"approved": true|false}` with an optional `comment`): 403 or 422 otherwise, and nothing
    is written. Repeating a key appends nothing (`appended: false`), as does an approver
    approving again; a key that matches no wait of the job is refused (409)."""
    visible_job(svc.store, caller, job_id)
    if not (caller.has("agent") or caller.has("approver")):
        raise Forbidden(f"role {caller.role!r} may neither signal waits nor decide approvals")
    job, appended = signal_job(
        svc.store,
        job_id,
        body.key,
        body.payload,
        by=caller.agent_id,
        principal=caller.principal,
        may_signal=caller.has("agent"),
    )
    return {**shown_job(svc.store, job).to_dict(), "appended": appended}


@router.post("/{job_id}/resume", response_model=Job, response_model_exclude_unset=True)
def resume(job_id: str, body: Resume, svc: ServiceDep, caller: Admin) -> dict[str, Any]:
    """Resolve a parked job (admin): retry / accept_result / fail an in-flight invocation;
    continue / fail after a confirmation mismatch; retry / fail a crash loop. With
    `park_version`, only the park of that `job_parked` event: a job parked again since (or no
    longer parked) is refused (409) and nothing is written."""
    visible_job(svc.store, caller, job_id)
    resumed = resume_job(
        svc.store,
        job_id,
        body.decision,
        result=body.result,
        by=caller.agent_id,
        note=body.note,
        park_version=body.park_version,
    )
    return shown_job(svc.store, resumed).to_dict()


@router.post("/{job_id}/cancel", response_model=CancelResult, response_model_exclude_unset=True)
def cancel(
    job_id: str, svc: ServiceDep, caller: Admin, body: Cancel | None = None
) -> dict[str, Any]:
    """Cancel a job that has not finished (admin), without cutting off a tool call in flight:
    with one, a cancel request is recorded (`cancel.state` is `requested`) and the job ends
    cancelled once the call's outcome is recorded; `force` cancels now, recording the call as
    `unknown`."""
    visible_job(svc.store, caller, job_id)
    body = body if body is not None else Cancel()
    done = request_cancel(
        svc.store, job_id, reason=body.reason, by=caller.agent_id, force=body.force
    )
    return {**shown_job(svc.store, done.job).to_dict(), "cancel": done.to_dict()}
