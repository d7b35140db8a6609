"""Request dependencies: the service state, and the caller (authenticated, rate limited, of a
sufficient role)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.exceptions import RequestValidationError

from affidavit.claims.sandbox import SandboxConfig
from affidavit.core.canonical import DuplicateKeyError, loads_unique
from affidavit.core.errors import JobNotFound
from affidavit.faces.auth import Caller, Forbidden, authenticate
from affidavit.faces.limits import ClaimLimits, ClaimSlots, StreamSlots
from affidavit.faces.ratelimit import Limiter
from affidavit.faces.sealed_cache import SealedCache
from affidavit.runtime import ToolRegistry
from affidavit.store import JobRecord, Store, unmatchable


@dataclass
class Service:
    """What the app serves from: one store, the tools submissions are checked against (``None``:
    workers check them when they run), the rate limiter, how claim commands run, the answers
    about sealed jobs computed so far."""

    store: Store
    tools: ToolRegistry | None
    limiter: Limiter | None
    sandbox: SandboxConfig | None = None  # claim commands (None: the default, bubblewrap)
    claims: ClaimSlots = field(default_factory=lambda: ClaimSlots(ClaimLimits()))
    streams: StreamSlots = field(default_factory=StreamSlots)  # GET /api/jobs/{id}/stream
    sealed: SealedCache = field(default_factory=SealedCache)  # answers about sealed jobs


def service(request: Request) -> Service:
    found: Service = request.app.state.service
    return found


ServiceDep = Annotated[Service, Depends(service)]


async def unique_json_keys(request: Request) -> None:
    """Every route's first dependency: a JSON body that gives a key twice in one object is
    refused (422, ``invalid_request``) as plan files and the CLI's JSON options refuse it —
    the parser would keep the last value, and another reader of the same bytes might not.
    (The body was already read and parsed for the route: this reads the cached bytes.)"""
    body = await request.body()
    if not body:
        return
    try:
        loads_unique(body)
    except DuplicateKeyError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": f"JSON decode error: {exc}"}]
        ) from None
    except (ValueError, RecursionError):
        return  # not JSON: refused by the route already, or a body it does not read as JSON


def caller_with(role: str) -> Callable[..., Caller]:
    """A dependency: the authenticated caller, who must have ``role`` or above."""

    def dependency(
        svc: ServiceDep,
        authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    ) -> Caller:
        caller = authenticate(svc.store, authorization)
        if svc.limiter is not None:
            svc.limiter.take(caller.key_id)
        if not caller.has(role):
            raise Forbidden(f"role {caller.role!r} may not do this; it needs {role!r} or above")
        return caller

    return dependency


Observer = Annotated[Caller, Depends(caller_with("observer"))]
AgentRole = Annotated[Caller, Depends(caller_with("agent"))]
Admin = Annotated[Caller, Depends(caller_with("admin"))]


def visible_job(store: Store, caller: Caller, job_id: str) -> JobRecord:
    """The job, if the caller may see it. Another namespace's job is "not found", exactly like
    a job that does not exist, so ids of other tenants do not leak.

    Raises:
        JobNotFound: no such job, or not the caller's namespace.
    """
    try:
        job = store.get_job(job_id)
    except JobNotFound:
        raise_if_archived(store, caller, job_id)
        raise
    if not caller.sees(job.namespace):
        raise JobNotFound(job_id)
    return job


def raise_if_archived(store: Store, caller: Caller, job_id: str) -> None:
    """For a job not in the live store: if retention removed it and the caller sees its
    namespace, say so (and where its pack went).

    Raises:
        JobArchived: it was archived.
    """
    from affidavit.retention import JobArchived, archived_job

    tomb = archived_job(store, job_id)
    if tomb is not None and caller.sees(tomb.namespace):
        raise JobArchived(tomb)


def check_verifiable(store: Store, caller: Caller, job_id: str) -> None:
    """:func:`check_visible` for verification, which also reports what is left of a job whose
    job row is gone (see :func:`~affidavit.verify.verify_one`): such records name no namespace,
    so only an admin (who sees every namespace) may have them verified.

    Raises:
        JobNotFound: no such job, one of another namespace, or no job row and not an admin.
    """
    if unmatchable(job_id):  # no job can have it
        raise JobNotFound(job_id)
    with store.snapshot(lenient_text=True) as snap:
        row = snap.job_row(job_id)
    if row is None:
        raise_if_archived(store, caller, job_id)
        if not caller.has("admin"):
            raise JobNotFound(job_id)
    elif not caller.sees(row["namespace"]):
        raise JobNotFound(job_id)


def check_visible(store: Store, caller: Caller, job_id: str) -> None:
    """:func:`visible_job` reading only what it needs: for verification, whose job row may
    have been edited outside the store (an output that is not JSON must get a verdict, not a
    server error).

    Raises:
        JobNotFound: no such job, or not the caller's namespace.
    """
    if unmatchable(job_id):  # no job can have it
        raise JobNotFound(job_id)
    with store.snapshot(lenient_text=True) as snap:
        row = snap.job_row(job_id)
    if row is None or not caller.sees(row["namespace"]):
        raise JobNotFound(job_id)
