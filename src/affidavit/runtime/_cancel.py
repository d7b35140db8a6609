"""Cancelling a job without the record lying about a tool call in flight (docs/runtime.md,
"Human decisions": ``lost`` means the effect did not happen).

A cancel is one durable transaction that locks the job first:

- no invocation of the job is open (a pending, waiting or parked job, a run between steps):
  the job is cancelled at once and its lease revoked, so a worker still running it writes
  nothing more — its next write, a tool call's T1 included, is fenced off before the tool is
  called;
- an invocation is open: a **cancel request** is recorded and nothing else. The call is not
  cut off: a live worker lets it finish and records its real outcome, exactly as if no cancel
  had come; a worker that died with it in flight leaves it to the next worker's recovery (the
  tool's ``reconcile`` hook, else the in-flight policy: a park for a person, or ``fail``); a
  parked job stays parked until a person resolves the park. From the request on, the store
  refuses to start anything new in the job (migration 17): the run that meets the refusal, at
  its next step boundary, ends the job as cancelled (:func:`end_cancelled`);
- ``force``: every open invocation is closed with the outcome ``unknown`` (the tool may or may
  not have acted; never ``lost``) and the job is cancelled at once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from affidavit.core.errors import FencedError, JobNotFound
from affidavit.core.events import utc_now
from affidavit.record import Sealer
from affidavit.runtime._decisions import InvalidStateError, _finished
from affidavit.runtime._journal import Journal
from affidavit.runtime._run_base import Item, close_open_invocations, open_closings
from affidavit.store import (
    CancelRequest,
    JobFilter,
    JobRecord,
    LedgerRow,
    NewEvent,
    Store,
    Transaction,
)

_LIVE = ("pending", "running", "waiting", "parked")  # a child that has not ended
# The most live children of one job a cancel reaches in one pass (a join awaits at most 1000)
MAX_CHILDREN_LISTED = 10_000

# The error of an invocation a forced cancel abandoned
ABANDONED = {
    "type": "unknown",
    "message": "the job was cancelled with --force while this invocation was in flight: "
    "the tool may or may not have acted",
}


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What a cancel did. ``state``: ``cancelled`` (the job ended now) or ``requested`` (a
    request is in force; the job ends cancelled once its call in flight is resolved).
    ``waiting_on`` (requested only): ``in_flight`` (a live worker is running the call and will
    record its outcome), ``recovery`` (the worker holding it stopped without recording it: the
    next worker to claim the job resolves it by the tool's reconcile hook or the in-flight
    policy) or ``parked`` (a person resolves the park first). ``in_flight``: the open
    invocations then; ``abandoned``: those a forced cancel closed as ``unknown``."""

    job: JobRecord
    state: str
    waiting_on: str | None = None
    request: CancelRequest | None = None
    in_flight: tuple[LedgerRow, ...] = ()
    abandoned: tuple[LedgerRow, ...] = ()

    def message(self) -> str:
        """One sentence for a person: what happened and what happens next."""
        job_id = self.job.job_id
        if self.state == "cancelled":
            if self.abandoned:
                calls = ", ".join(_call(r) for r in self.abandoned)
                return (
                    f"job {job_id} cancelled; abandoned in flight, recorded as unknown (the tool "
                    f"may or may not have acted): {calls}"
                )
            return f"job {job_id} cancelled"
        calls = ", ".join(_call(r) for r in self.in_flight)
        then = {
            "in_flight": "it will finish and its outcome be recorded; then the job ends cancelled",
            "recovery": "its worker stopped without recording it: the next worker to claim the "
            "job asks the tool's reconcile hook (or applies the in-flight policy), then the job "
            "ends cancelled",
            "parked": "the job is parked on it: once a person resolves the park "
            "(`affidavit resume`), the job ends cancelled",
        }[self.waiting_on or "in_flight"]
        return (
            f"cancel requested for job {job_id} (now {self.job.status}); in flight: {calls}; "
            f"{then}. `affidavit cancel {job_id} --force` abandons it as unknown"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "waiting_on": self.waiting_on,
            "request": self.request.to_dict() if self.request is not None else None,
            "in_flight": [_row_doc(r) for r in self.in_flight],
            "abandoned": [_row_doc(r) for r in self.abandoned],
            "message": self.message(),
        }


def _call(row: LedgerRow) -> str:
    return f"{row.tool_name} (node {row.node_id!r}, key {row.idempotency_key[:16]}…)"


def _row_doc(row: LedgerRow) -> dict[str, Any]:
    return {
        "node_id": row.node_id,
        "tool_name": row.tool_name,
        "idempotency_key": row.idempotency_key,
        "invocation_id": row.invocation_id,
    }


def request_cancel(
    store: Store,
    job_id: str,
    *,
    reason: str | None = None,
    by: str | None = None,
    force: bool = False,
    sealer: Sealer | None = None,
    clock: Callable[[], float] = time.time,
) -> CancelResult:
    """Cancel ``job_id``, or request its cancel when a tool call of it is in flight (see the
    module docstring). A job cancelled now is sealed in the same transaction, with ``sealer``
    (default: the key file for this store). A second request returns the first.

    Its child jobs (``ctx.start_job``) that have not ended are cancelled the same way, first
    (each reports ``cancelled`` to the parent as its result) and again after the parent's
    cancel, for a child its run created meanwhile.

    Raises:
        JobNotFound: no such job.
        InvalidStateError: the job already completed, failed or was cancelled.
    """
    sealer = sealer if sealer is not None else Sealer.for_store(store)
    found = store.get_job(job_id)  # an unknown job creates no key,
    if found.terminal:  # nor does a refusal (checked again under the lock)
        raise _finished(found)
    sealer.admit(store)  # load or create it, and admit it, before the transaction
    _cancel_children(store, job_id, reason, by, force, sealer, clock)
    done = _cancel_one(store, job_id, reason, by, force, sealer, clock)
    _cancel_children(store, job_id, reason, by, force, sealer, clock)
    return done


#: The reason recorded with the cancel of a job whose data subject is being erased.
ERASURE_REASON = "its data subject is being erased"


def erasure_cancel(
    store: Store, *, by: str | None = None, sealer: Sealer | None = None
) -> Callable[[str], str]:
    """The cancel an erasure asks for each unfinished job of its subject (``affidavit erase``,
    ``POST /api/subjects/{s}/erase``): :func:`request_cancel` by its rules (a call in flight
    finishes and records its real outcome first), answering ``"cancelled"``, ``"requested"``
    or ``"ended"`` (the job had finished meanwhile)."""

    def cancel(job_id: str) -> str:
        try:
            return request_cancel(store, job_id, reason=ERASURE_REASON, by=by, sealer=sealer).state
        except InvalidStateError:
            return "ended"

    return cancel


def cancel_children_of_failed(store: Store, job_id: str, *, sealer: Sealer | None = None) -> None:
    """After ``job_id`` failed: cancel its child jobs that have not ended (and theirs), by the
    rules of :func:`request_cancel` — a child with a tool call in flight finishes that call
    and records its real outcome, then ends ``cancelled``; a pending or waiting child ends
    ``cancelled`` now. Nothing will join them, and a child left running would act for a
    parent that gave up. (A parked parent leaves its children running: a person decides the
    park, and may resume the parent, which then joins them.)"""
    if not store.list_jobs(JobFilter(parent=job_id, status=_LIVE, limit=1)):
        return  # (the common case: one query)
    sealer = sealer if sealer is not None else Sealer.for_store(store)
    _cancel_children(
        store, job_id, f"parent job {job_id} failed", "affidavit", False, sealer, time.time
    )


def _cancel_children(
    store: Store,
    job_id: str,
    reason: str | None,
    by: str | None,
    force: bool,
    sealer: Sealer,
    clock: Callable[[], float],
) -> None:
    """Cancel every child of ``job_id`` that has not ended (and theirs)."""
    live = JobFilter(parent=job_id, status=_LIVE)
    for child in [j.job_id for j in store.list_jobs(replace(live, limit=MAX_CHILDREN_LISTED))]:
        with contextlib.suppress(InvalidStateError):  # it ended meanwhile: that is its result
            request_cancel(
                store, child, reason=reason, by=by, force=force, sealer=sealer, clock=clock
            )


def _cancel_one(
    store: Store,
    job_id: str,
    reason: str | None,
    by: str | None,
    force: bool,
    sealer: Sealer,
    clock: Callable[[], float],
) -> CancelResult:
    with store.transaction(durable=True) as tx:
        job = tx.get_job(job_id, for_update=True)  # the open invocations come from the ledger
        if job is None:
            raise JobNotFound(job_id)
        if job.terminal:
            raise _finished(job)
        rows = tuple(tx.ledger_open(job_id))
        at = utc_now()
        if rows and not force:
            request = tx.request_cancel(job_id, at=at, reason=reason, by=by)
            return CancelResult(job, "requested", _waiting_on(job, clock()), request, rows)
        asked = tx.cancel_request(job_id)  # (a forced cancel after a request: its reason)
        if asked is not None and reason is None:
            reason = asked.reason
        events = [
            NewEvent(event_type, {"at": at, **payload})
            for event_type, payload in close_open_invocations(tx, job_id, ABANDONED)
        ]
        events.append(NewEvent("job_cancelled", {"at": at, "reason": reason, "by": by}))
        tx.append(job_id, events, expected_version=job.version)
        tx.set_lease(job_id, attempt_id=None, owner=None, expires_at=None)
        cancelled = tx.update_job(job_id, status="cancelled")
        sealer.seal_txn(tx, job_id)
        return CancelResult(cancelled, "cancelled", abandoned=rows)


def _waiting_on(job: JobRecord, now: float) -> str:
    """What a cancel request waits for (see :class:`CancelResult`)."""
    if job.status == "parked":
        return "parked"
    live = job.status == "running" and job.lease_owner is not None
    if live and job.lease_expires_at is not None and job.lease_expires_at > now:
        return "in_flight"
    return "recovery"


# --- the run's side ---------------------------------------------------------------------------


def end_cancelled(journal: Journal) -> str:
    """End the job of ``journal``'s run as cancelled: the store refused to start anything new in
    it (:class:`~affidavit.core.errors.CancelRequestedError`), so every call of this run in
    flight has finished and recorded its outcome. An invocation still open (none, on the usual
    path) is closed as ``unknown``. Sealed in the same durable transaction. Returns the run's
    status: ``cancelled``, or ``lost`` when the run no longer holds the job (a forced cancel
    came first)."""
    job_id = journal.job_id

    def write(tx: Transaction) -> None:
        request = tx.cancel_request(job_id)
        closings = open_closings(tx, job_id, ABANDONED)
        cancelled: Item = (
            "job_cancelled",
            {
                "reason": request.reason if request is not None else None,
                "by": request.by if request is not None else None,
            },
        )
        journal.append(tx, *closings, cancelled)
        for _, payload in closings:
            tx.ledger_finish(job_id, payload["idempotency_key"], status="failed", error=ABANDONED)
        tx.set_status(job_id, status="cancelled", fence=journal.claim.attempt_id)
        tx.set_lease(job_id, attempt_id=None, owner=None, expires_at=None)
        journal.seal(tx)

    try:
        journal.tx_retrying(True, write)
    except FencedError:
        return "lost"
    return "cancelled"


def found_nothing(
    journal: Journal, base: dict[str, Any], invocation: str, key: str, error: dict[str, Any]
) -> None:
    """The in-flight invocation ``invocation`` of ``key``, which the tool's reconcile hook found
    no effect of, closed as ``lost`` (the hook's answer is the evidence) without a new try: the
    job was asked to cancel, so none starts."""

    def write(tx: Transaction) -> None:
        journal.append(
            tx,
            (
                "tool_invocation_finished",
                {
                    **base,
                    "invocation_id": invocation,
                    "idempotency_key": key,
                    "outcome": "lost",
                    "error": error,
                    "catch_up": True,
                },
            ),
        )
        tx.ledger_finish(journal.job_id, key, status="failed", error=error)

    journal.tx_retrying(True, write)
