"""Human decisions on a job: signal a wait, resume a parked job, cancel.

These are the service functions behind ``affidavit signal|resume|cancel`` and the HTTP API.
Each is one durable transaction that locks the job first, so concurrent decisions on one job
are serialized: the second sees what the first wrote (a duplicate signal appends nothing).
Nothing is written when a decision is refused.
"""

from __future__ import annotations

from typing import Any

from affidavit.core.approvals import Principal, SignalForbidden
from affidavit.core.budget import Budget
from affidavit.core.canonical import canonical_nested, canonical_sha256
from affidavit.core.errors import (
    AffidavitError,
    ConfigError,
    JobNotFound,
    SignalRejected,
)
from affidavit.core.events import utc_now
from affidavit.core.parks import DECISIONS_BY_REASON, RESUME_DECISIONS
from affidavit.record import ReplayContext, Sealer, build_from_events
from affidavit.runtime._approvals import record_decision
from affidavit.runtime._run_base import close_open_invocations
from affidavit.store import JobRecord, NewEvent, Store, Transaction


class InvalidStateError(AffidavitError):
    code = "invalid_state"
    default_hint = "Check the job's status with `affidavit jobs show JOB`."


def _locked(tx: Transaction, job_id: str) -> tuple[JobRecord, ReplayContext]:
    """The job, locked against concurrent writers for the rest of ``tx``, and its log — read
    through ``tx``: a decision that waited for a second connection while holding the first
    could starve a PostgreSQL pool (every decision holding one, all waiting)."""
    job = tx.get_job(job_id, for_update=True)
    if job is None:
        raise JobNotFound(job_id)
    return job, build_from_events(tx.list_events(job_id), tx.job_cipher(job_id))


# --- signal -----------------------------------------------------------------------------------


def signal_job(
    store: Store,
    job_id: str,
    key: str,
    payload: Any = None,
    *,
    by: str | None = None,
    principal: Principal | None = None,
    may_signal: bool = True,
) -> tuple[JobRecord, bool]:
    """Complete the wait of ``job_id`` whose correlation key is ``key``: append
    ``wait_completed`` with ``payload`` (the wait node's output) and make the job runnable.

    An approval is decided instead by ``principal``'s decision ``payload`` (see
    :func:`~affidavit.runtime._approvals.record_decision`): it completes the wait once the
    approval's policy is met (``by`` is not used for it). ``may_signal=False``: the caller
    may decide approvals only (an API key of role approver), not complete other waits.

    Returns ``(job, appended)``; a key that was already signalled returns ``appended=False``
    and writes nothing (signals are idempotent; an approver who approved already counts once).

    Raises:
        JobNotFound: no such job.
        SignalRejected: no wait of the job has this key, or the job ended before the signal.
        SignalPayloadError: an approval answered with anything but ``{"approved": true}`` or
            ``{"approved": false}`` (with an optional text ``comment``).
        ApprovalRefused: an approval decided by no principal, or by one its policy does not
            allow (the job's submitter; a role other than approver or admin; one not among
            its ``approvers``).
        SignalForbidden: a wait that is not an approval, and ``may_signal`` is false.
        CanonicalizationError: the payload is not JSON that can be recorded.
    """
    canonical_nested(payload)  # (the wait node's output: recorded inside the job's)
    with store.transaction(durable=True) as tx:
        job, replay = _locked(tx, job_id)
        if key in replay.completed_waits:
            return job, False
        wait = replay.waits.get(key)
        if wait is None:
            waiting = ", ".join(k for k in replay.waits if k not in replay.completed_waits)
            raise SignalRejected(
                f"job {job_id} has no wait with correlation key {key!r}",
                hint=f"Open waits: {waiting}." if waiting else "The job waits for nothing now.",
            )
        if job.terminal:
            raise SignalRejected(f"job {job_id} is {job.status}; it takes no more signals")
        if wait.get("wait_type") == "timer":
            raise SignalRejected(
                f"the wait {key!r} of job {job_id} is a timer (ctx.sleep): it ends on its own"
            )
        if wait.get("wait_type") == "child":
            raise SignalRejected(
                f"the wait {key!r} of job {job_id} is for child jobs: it ends when they do"
            )
        if wait.get("wait_type") == "approval":
            return record_decision(tx, job, replay, wait, key, payload, principal)
        if not may_signal:
            raise SignalForbidden(f"{key!r} is not an approval: this key may only decide those")
        tx.append(
            job_id,
            [
                NewEvent(
                    "wait_completed",
                    {
                        "at": utc_now(),
                        "node_id": wait["node_id"],
                        "correlation_key": key,
                        "payload": payload,
                        "signalled_by": by,
                    },
                )
            ],
            expected_version=job.version,
        )
        return tx.update_job(job_id, status="pending"), True


# --- resume -----------------------------------------------------------------------------------


def resume_job(
    store: Store,
    job_id: str,
    decision: str,
    *,
    result: Any = None,
    by: str | None = None,
    note: str | None = None,
    sealer: Sealer | None = None,
    park_version: int | None = None,
    budget: Any = None,
) -> JobRecord:
    """Resolve a parked job (docs/formats.md §3 closing rule). (Long only for this docstring:
    the decisions each kind of park takes.) Parked on an in-flight invocation:

    - ``retry``: the invocation is closed as ``lost`` (a person says it did not act) and the
      tool may run again;
    - ``accept_result``: the invocation is closed as a success with ``result`` (the effect
      happened; a person checked) and the job continues;
    - ``fail``: the invocation is closed as ``unknown`` and the job fails.

    ``retry`` and ``accept_result`` close only the invocation the job parked on; any other
    invocation a dead attempt left open is resolved by its own tool (reconcile hook or
    in-flight policy) when the job runs again. A job failed here (``fail``, whatever the
    park) has every invocation still open closed as ``unknown`` first.

    Parked by confirmation replay (``replay_verification``):

    - ``continue``: a person accepts the world as it is; the mismatched steps are not checked
      again in this job and it continues;
    - ``fail``: the job fails.

    Parked as a crash loop (``crash_loop``: its runs kept ending without a word):

    - ``retry``: the job is runnable again (the count of recoveries starts again); an
      invocation left open is resolved by its tool's reconcile hook or in-flight policy;
    - ``fail``: the job fails.

    Parked because a call would have exceeded the job's budget (``budget_exceeded``):

    - ``continue`` with ``budget`` (``{"tool_calls": 80, "model_tokens": ..., "cost": ...}``):
      the job's budget from now on, absolute (not an increment), recorded in ``job_resumed``;
    - ``fail``: the job fails.

    A job failed here is sealed in the same transaction, with ``sealer`` (default: the key
    file for this store, see :mod:`affidavit.record._sealing`); then its child jobs that have
    not ended are cancelled (:func:`~affidavit.runtime._cancel.cancel_children_of_failed`).

    ``park_version`` pins the decision to one park: the version of its ``job_parked`` event
    (``parked.version`` in ``jobs show`` and the trace; unique in the job's log). The decision
    is applied only if that park is still the one in force — checked in the transaction that
    applies it, under the job's lock — so a decision made about a park that was resolved since
    (and the job parked again) is refused instead of applied to a park nobody looked at.
    Without it, the decision resolves whatever park is in force.

    Raises:
        JobNotFound: no such job.
        InvalidStateError: the job is not parked, the park in force is not the one
            ``park_version`` names, or the decision does not fit the park.
        ConfigError: ``park_version`` is not a positive integer.
    """
    _check_decision(decision, result, park_version)
    sealer = sealer if sealer is not None else Sealer.for_store(store)
    if decision == "fail":
        found = store.get_job(job_id)  # an unknown job creates no key,
        if found.status != "parked":  # nor does a refusal (checked again under the lock)
            raise _not_parked(found, park_version)
        sealer.admit(store)  # load or create it, and admit it, before the transaction
    with store.transaction(durable=True) as tx:
        job, replay = _locked(tx, job_id)
        _check_park(job, replay, park_version)
        assert replay.parked is not None
        reason = _parked_for(job_id, replay, decision)
        resumed = _new_budget(reason, decision, budget)
        at = utc_now()
        events = _closed_by(tx, job_id, replay, reason, decision, result, at)
        events.append(
            NewEvent(
                "job_resumed",
                {"at": at, "decision": decision, "result": result, "by": by, "note": note}
                | resumed,
            )
        )
        if decision != "fail":
            tx.append(job_id, events, expected_version=job.version)
            return tx.update_job(job_id, status="pending")
        failed = _fail_parked(tx, job, replay, reason, events, at, sealer)
    from affidavit.runtime._cancel import cancel_children_of_failed

    cancel_children_of_failed(store, job_id, sealer=sealer)  # (after the commit: its own)
    return failed


def _check_decision(decision: str, result: Any, park_version: int | None) -> None:
    """Refuse a decision that is not one, a result without ``accept_result`` (or the other
    way round), a result that cannot be recorded, or a ``park_version`` that names no
    event."""
    if decision not in RESUME_DECISIONS:
        raise InvalidStateError(
            f"unknown decision {decision!r}", hint=f"Use one of: {', '.join(RESUME_DECISIONS)}."
        )
    if decision == "accept_result" and result is None:
        raise InvalidStateError("accept_result needs --result (the effect's result)")
    if decision != "accept_result" and result is not None:
        raise InvalidStateError(
            f"a result goes only with accept_result, not with {decision!r}",
            hint="Leave out --result, or decide accept_result.",
        )
    if result is not None:
        canonical_nested(result)  # (the step's result: recorded inside the job's output)
    if park_version is not None and (type(park_version) is not int or park_version < 1):
        raise ConfigError(
            f"park_version must be a positive integer (the version of a job_parked event), "
            f"not {park_version!r}"
        )


def _parked_for(job_id: str, replay: ReplayContext, decision: str) -> str:
    """The reason of the park in force, refusing a ``decision`` that does not resolve it."""
    assert replay.parked is not None
    reason = str(replay.parked.get("reason"))
    allowed = DECISIONS_BY_REASON.get(reason, ("fail",))
    if decision not in allowed:
        raise InvalidStateError(
            f"job {job_id} is parked for {reason} (park at version "
            f"{replay.parked_version}); {decision!r} does not resolve that",
            hint=f"Use one of: {', '.join(allowed)}.",
        )
    return reason


def _closed_by(
    tx: Transaction,
    job_id: str,
    replay: ReplayContext,
    reason: str,
    decision: str,
    result: Any,
    at: str,
) -> list[NewEvent]:
    """The events that close invocations as ``decision`` resolves the park: the one the job
    parked on (in flight), and with ``fail`` every other one still open."""
    assert replay.parked is not None
    events: list[NewEvent] = []
    parked_key = replay.parked.get("idempotency_key") if reason == "in_flight" else None
    if parked_key in replay.pending_tool_invocations:
        events += _close_parked(tx, job_id, replay, str(parked_key), decision, result, at)
    if decision == "fail":
        # the job ends: every other invocation still open is closed too (§3 closing rule)
        ended = {"type": "unknown", "message": "the job was failed by a person while this "
                 "invocation was open; the tool may or may not have acted"}  # fmt: skip
        events += _closing_events(tx, job_id, at, ended, skip=parked_key)
    return events


def _fail_parked(
    tx: Transaction,
    job: JobRecord,
    replay: ReplayContext,
    reason: str,
    events: list[NewEvent],
    at: str,
    sealer: Sealer,
) -> JobRecord:
    """Fail the parked job, a person's decision: ``events`` and its ``job_failed``, and its
    seal, in ``tx``."""
    assert replay.parked is not None
    error = {
        "type": reason,
        "message": "invocation in flight or lost; failed by a person"
        if reason == "in_flight"
        else f"parked for {reason}; failed by a person",
    }
    events.append(
        NewEvent(
            "job_failed",
            {"at": at, "error": error, "node_id": replay.parked.get("node_id")},
        )
    )
    tx.append(job.job_id, events, expected_version=job.version)
    failed = tx.update_job(job.job_id, status="failed", error=error)
    sealer.seal_txn(tx, job.job_id)
    return failed


def _new_budget(reason: str, decision: str, budget: Any) -> dict[str, Any]:
    """The ``budget`` of a ``job_resumed`` (empty when none goes with the decision)."""
    if reason == "budget_exceeded" and decision == "continue":
        if budget is None:
            raise InvalidStateError(
                "continuing a job parked for budget_exceeded needs its new budget",
                hint="Pass --budget '{\"tool_calls\": 80}' (absolute, not an increment).",
            )
        return {"budget": Budget.from_dict(budget).to_dict()}
    if budget is not None:
        raise InvalidStateError(
            f"a budget goes only with continue on a budget_exceeded park, not with {decision!r}"
            f" on a {reason} park",
            hint="Leave out --budget.",
        )
    return {}


def _check_park(job: JobRecord, replay: ReplayContext, park_version: int | None) -> None:
    """Refuse unless the job is parked and, with ``park_version``, parked by the
    ``job_parked`` event of that version (a park is never reopened: a later one has a later
    version)."""
    if job.status != "parked" or replay.parked is None:
        raise _not_parked(job, park_version)
    current = replay.parked_version
    if park_version is not None and park_version != current:
        reason = replay.parked.get("reason")
        raise InvalidStateError(
            f"job {job.job_id} is parked at version {current} for {reason}, not by the park at "
            f"version {park_version}: nothing was decided",
            hint=f"Look at the park in force (`affidavit jobs show {job.job_id}`) and decide "
            f"about it, pinning version {current}.",
        )


def _not_parked(job: JobRecord, park_version: int | None) -> InvalidStateError:
    """The refusal of a decision about a job that is not parked."""
    pinned = f"; the park at version {park_version} is no longer in force: nothing was decided"
    return InvalidStateError(
        f"job {job.job_id} is {job.status}, not parked" + (pinned if park_version else "")
    )


def _close_parked(
    tx: Transaction,
    job_id: str,
    replay: ReplayContext,
    key: str,
    decision: str,
    result: Any,
    at: str,
) -> list[NewEvent]:
    """Close the invocation the job parked on as the person decided; mark its ledger row to
    match. Other invocations still open are not this decision's: each is resolved by its own
    tool's reconcile hook or in-flight policy when the job runs again."""
    started = replay.pending_tool_invocations[key]
    base = {"at": at, "node_id": started["node_id"], "step_id": started["step_id"]}
    closing = {
        **base,
        "invocation_id": started["invocation_id"],
        "idempotency_key": key,
        "catch_up": True,
    }
    if decision == "accept_result":
        cipher = tx.job_cipher(job_id)  # a subject's job: the result is hashed as it is stored
        if cipher is not None:
            result = cipher.seal(result)
        tx.ledger_finish(job_id, key, status="committed", result=result)
        return [
            NewEvent(
                "tool_invocation_finished", {**closing, "outcome": "success", "result": result}
            ),
            NewEvent(
                "command_committed",
                {
                    **base,
                    "command_id": started["invocation_id"],
                    "idempotency_key": key,
                    "result_hash": canonical_sha256(result),
                },
            ),
            NewEvent(
                "node_finished",
                {
                    **base,
                    "result_type": "side_effect_committed",
                    "attempt": started["attempt"],
                    "duration_ms": 0,
                },
            ),
        ]
    # retry: a person says the effect did not happen (lost); fail says nothing of it (unknown)
    outcome = "lost" if decision == "retry" else "unknown"
    error = {"type": outcome, "message": f"resolved by a person: {decision}"}
    tx.ledger_finish(job_id, key, status="failed", error=error)
    events = [NewEvent("tool_invocation_finished", {**closing, "outcome": outcome, "error": error})]
    if decision == "fail":
        events.append(
            NewEvent(
                "node_finished",
                {
                    **base,
                    "result_type": "permanent_failure",
                    "error": error,
                    "attempt": started["attempt"],
                    "duration_ms": 0,
                },
            )
        )
    return events


def _closing_events(
    tx: Transaction, job_id: str, at: str, error: dict[str, Any], *, skip: str | None = None
) -> list[NewEvent]:
    """:func:`~affidavit.runtime._run_base.close_open_invocations` as events stamped ``at``."""
    return [
        NewEvent(event_type, {"at": at, **payload})
        for event_type, payload in close_open_invocations(tx, job_id, error, skip=skip)
    ]


# --- cancel -----------------------------------------------------------------------------------


def cancel_job(
    store: Store,
    job_id: str,
    *,
    reason: str | None = None,
    by: str | None = None,
    sealer: Sealer | None = None,
    force: bool = False,
) -> JobRecord:
    """Cancel a job that is not finished, without cutting off a tool call in flight: a job
    with no open invocation is cancelled (and sealed, with ``sealer``) at once and its lease
    revoked; one with an open invocation gets a cancel request — the call finishes (or, its
    worker dead, is resolved by the tool's reconcile hook or the in-flight policy) and its
    outcome is recorded, then the job ends cancelled. ``force`` cancels at once, closing open
    invocations as ``unknown``. The job as it is after the cancel (still ``running`` or
    ``parked`` while a request waits); :func:`affidavit.runtime._cancel.cancel` says more.

    Raises:
        JobNotFound: no such job.
        InvalidStateError: the job already completed, failed or was cancelled.
    """
    from affidavit.runtime._cancel import request_cancel  # (it uses this module's refusals)

    return request_cancel(store, job_id, reason=reason, by=by, force=force, sealer=sealer).job


def _finished(job: JobRecord) -> InvalidStateError:
    """The refusal to cancel a job that has finished."""
    return InvalidStateError(f"job {job.job_id} is already {job.status}")
