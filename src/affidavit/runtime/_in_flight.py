"""An invocation a dead attempt started and never finished (its ledger row ``started``).

The tool's ``reconcile`` hook, asked with the dead attempt's external key, decides when the
tool has one: an effect found is committed as a catch-up; nothing found closes the dead
invocation as ``lost`` and starts this attempt's. Otherwise (no hook, or the lookup failed) the
job's (or the tool's) ``in_flight`` policy parks the job for a person or fails it. Used by the
step executor (:mod:`affidavit.runtime._step_executor`) and, for ``reconcile``, by recovery.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from affidavit.core.errors import CancelRequestedError
from affidavit.core.plan import external_key
from affidavit.runtime._cancel import found_nothing
from affidavit.runtime._ledger_steps import commit
from affidavit.runtime._run_base import Item, Stop, check_result, error_dict
from affidavit.runtime._sdk import Tool, ToolContext
from affidavit.store import LedgerRow, Transaction

if TYPE_CHECKING:
    from affidavit.runtime._step_executor import StepExecutor, StepSpec

# the error of an invocation the tool's reconcile hook found no effect of
NOT_FOUND = {"type": "lost", "message": "reconcile found no effect"}


def reconcile(
    ex: StepExecutor,
    spec: StepSpec,
    t: Tool,
    args: dict[str, Any],
    key: str,
    row: LedgerRow,
    attempt: int,
) -> tuple[tuple[Any] | None, dict[str, Any] | None]:
    """Ask ``t``'s reconcile hook whether the invocation a dead attempt left open (``row``)
    acted, with that attempt's external key. An effect found is committed at once as a
    catch-up (``((result,), None)``); ``(None, None)`` when the hook found nothing,
    ``(None, error)`` when the lookup itself failed. Nothing is written then."""
    assert t.reconcile_fn is not None
    job_id = ex.job_id
    ctx = ToolContext(
        job_id,
        spec.node_id,
        row.step_id,
        attempt,
        key,
        external_key(job_id, row.step_id, row.attempt_id),
    )
    t0 = time.perf_counter()
    try:
        found = ex.call(spec, t.reconcile_fn, ctx, args)
        if found is not None:
            check_result(spec.node_id, t, found)
    except Exception as exc:  # the lookup failed (or timed out): decided as without a hook
        return None, error_dict(exc)
    if found is None:
        return None, None
    output = commit(
        ex,
        durable=False,
        spec=spec,
        step_id=row.step_id,
        key=key,
        invocation=row.invocation_id,
        result=found,
        attempt=attempt,
        t0=t0,
        ctx=ctx,
        catch_up=True,
    )
    return (output,), None


def resolve_in_flight(
    ex: StepExecutor,
    spec: StepSpec,
    t: Tool,
    args: dict[str, Any],
    key: str,
    row: LedgerRow,
    attempt: int,
    started_events: tuple[Item, Item],
) -> tuple[Any] | None:
    """Resolve an invocation that a dead attempt started and never finished. Returns
    ``(result,)`` when reconcile found the effect (caught up), ``None`` when it found
    nothing (the dead invocation is closed as lost and ours is started); parks or fails
    the job otherwise (raising)."""
    node_id = spec.node_id
    # What is decided about the dead invocation is its attempt's outcome (its node_started
    # is the latest), as a person's decision on it is; ``attempt`` is the next one's.
    dead_attempt = ex.replay.node_attempts.get(node_id, attempt)
    reconcile_error: dict[str, Any] | None = None
    if t.reconcile_fn is not None:
        found, reconcile_error = reconcile(ex, spec, t, args, key, row, dead_attempt)
        if found is not None:
            return found
        if reconcile_error is None:
            _restart(ex, spec, key, row, started_events)
            return None
    policy = t.in_flight or ex.policy.in_flight
    detail: dict[str, Any] = {
        "invocation_id": row.invocation_id,
        "dead_attempt_id": row.attempt_id,
        "tool_name": t.name,
        "message": "the tool may or may not have acted; it has no reconcile hook",
    }
    if reconcile_error is not None:
        detail["message"] = "the tool may or may not have acted; its reconcile hook failed"
        detail["reconcile_error"] = reconcile_error
    if policy == "park":
        raise ex.journal.park(
            "in_flight",
            node_id=node_id,
            step_id=row.step_id,
            detail=detail,
            idempotency_key=key,
        )
    _fail(ex, spec, key, row, dead_attempt, detail)
    raise Stop("failed")


def _restart(
    ex: StepExecutor,
    spec: StepSpec,
    key: str,
    row: LedgerRow,
    started_events: tuple[Item, Item],
) -> None:
    """Reconcile found nothing: the dead invocation is closed as ``lost`` and this attempt's
    is started, with its ledger row restarted, in one transaction."""
    job_id = ex.job_id
    base = {"node_id": spec.node_id, "step_id": row.step_id}
    dead = row.invocation_id
    invocation = started_events[1][1]["invocation_id"]
    attempt_id = ex.journal.claim.attempt_id

    def restart(tx: Transaction) -> None:
        ex.journal.append(
            tx,
            (
                "tool_invocation_finished",
                {
                    **base,
                    "invocation_id": dead,
                    "idempotency_key": key,
                    "outcome": "lost",
                    "error": NOT_FOUND,
                    "catch_up": True,
                },
            ),
            *started_events,
        )
        tx.ledger_restart(job_id, key, invocation_id=invocation, attempt_id=attempt_id)

    try:
        ex.journal.tx_retrying(True, restart)
    except CancelRequestedError:  # no new try: the found-nothing is recorded alone
        found_nothing(ex.journal, base, dead, key, NOT_FOUND)
        raise


def _fail(
    ex: StepExecutor,
    spec: StepSpec,
    key: str,
    row: LedgerRow,
    dead_attempt: int,
    detail: dict[str, Any],
) -> None:
    """The ``fail`` policy: the dead invocation closed as ``unknown``, the step and the job
    failed, the job sealed — in one transaction."""
    job_id = ex.job_id
    node_id = spec.node_id
    base = {"node_id": node_id, "step_id": row.step_id}
    dead = row.invocation_id
    error = {**detail, "type": "in_flight", "message": "invocation in flight or lost"}

    def fail(tx: Transaction) -> None:
        ex.journal.close_open(tx, keep=key)
        ex.journal.append(
            tx,
            (
                "tool_invocation_finished",
                {
                    **base,
                    "invocation_id": dead,
                    "idempotency_key": key,
                    "outcome": "unknown",  # (the tool may or may not have acted)
                    "error": error,
                    "catch_up": True,
                },
            ),
            (
                "node_finished",
                {
                    **base,
                    "result_type": "permanent_failure",
                    "error": error,
                    "attempt": dead_attempt,
                    "duration_ms": 0,
                },
            ),
            ("job_failed", {"error": error, "node_id": node_id}),
        )
        tx.ledger_finish(job_id, key, status="failed", error=error)
        tx.set_status(job_id, status="failed", error=error, fence=ex.journal.claim.attempt_id)
        ex.journal.seal(tx)

    ex.journal.tx_retrying(True, fail)
