"""A tool call past its time limit (docs/runtime.md, "Timeouts").

The call was abandoned, not stopped (a thread cannot be killed): it may have acted, may be
acting still, or may never act. Its outcome is unknown, so it is resolved — never blindly
tried again:

- the tool has a ``reconcile`` hook: asked at once, with the call's own external key. An
  effect found is committed as a catch-up; nothing found closes the call as ``lost`` (the
  hook's answer is the evidence) and another try follows, with the same external key, as after
  any failure; a lookup that fails is decided as without a hook;
- the tool is declared ``idempotent=True``: the call is closed with the outcome ``timeout``
  and tried again under the retry policy;
- otherwise the job parks (``in_flight``) with the call open, as on an invocation a dead
  worker left: a person decides with ``affidavit resume`` (``retry``, ``accept_result``,
  ``fail``).

Each closing carries the call's ``timeout_seconds`` and its ``resolution`` (``reconcile`` or
``retry``); a park's detail carries ``timeout_seconds``. Whatever the abandoned call does
later is only logged (:mod:`affidavit.runtime._step_calls`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from affidavit.core import crash
from affidavit.runtime._in_flight import NOT_FOUND
from affidavit.runtime._ledger_steps import commit, record_failure
from affidavit.runtime._run_base import Item, StepFailed, check_result, elapsed_ms, error_dict
from affidavit.runtime._sdk import ToolContext

if TYPE_CHECKING:
    from affidavit.runtime._step_calls import CallTimedOut
    from affidavit.runtime._step_executor import StepExecutor, _Try


def resolve_timeout(
    ex: StepExecutor, try_: _Try, exc: CallTimedOut, limit: int
) -> tuple[bool, Any]:
    """Resolve the timed-out try ``try_`` (see the module docstring): ``(True, the result as
    recorded)`` when the reconcile hook found its effect, ``(False, None)`` when another try
    is due (its backoff waited out).

    Raises:
        StepFailed: no try is left.
        Stop: the job parked on the call (or the run must end).
    """
    crash.crash_point("tool.after_timeout")  # (the call open: recovery resolves it)
    spec, t = try_.spec, try_.tool
    seconds = spec.timeout_seconds
    lookup_error: dict[str, Any] | None = None
    if t.reconcile_fn is not None:
        c = try_.ctx
        ctx = ToolContext(
            c.job_id, c.node_id, c.step_id, c.attempt, c.idempotency_key, c.external_key
        )
        try:
            found = ex.call(spec, t.reconcile_fn, ctx, try_.args)
            if found is not None:
                check_result(spec.node_id, t, found)
        except Exception as failed:  # (a lookup that times out too): decided as without a hook
            lookup_error = error_dict(failed)
        else:
            resolved = {"timeout_seconds": seconds, "resolution": "reconcile"}
            if found is not None:
                output = commit(
                    ex,
                    durable=False,
                    spec=spec,
                    key=try_.key,
                    invocation=try_.invocation,
                    result=found,
                    attempt=try_.attempt,
                    t0=try_.t0,
                    ctx=ctx,
                    catch_up=True,
                    timed_out=resolved,
                )
                return True, output
            return _closed(ex, try_, limit, "lost", dict(NOT_FOUND), {**resolved, "catch_up": True})
    if t.idempotent:
        resolved = {"timeout_seconds": seconds, "resolution": "retry", "catch_up": False}
        return _closed(ex, try_, limit, "timeout", error_dict(exc), resolved)
    detail: dict[str, Any] = {
        "invocation_id": try_.invocation,
        "tool_name": t.name,
        "timeout_seconds": seconds,
        "message": f"the call ran past its timeout ({seconds}s) and was abandoned: the tool may "
        "or may not have acted; it has no reconcile hook and is not declared idempotent",
    }
    if lookup_error is not None:
        detail["message"] = (
            f"the call ran past its timeout ({seconds}s) and was abandoned: the tool may or "
            "may not have acted; its reconcile hook failed"
        )
        detail["reconcile_error"] = lookup_error
    ex.give_back(ex.grants.pop(try_.key, None))  # (a limited call's slot: nothing runs for it)
    raise ex.journal.park(
        "in_flight",
        node_id=spec.node_id,
        step_id=spec.step_id,
        detail=detail,
        idempotency_key=try_.key,
    )


def _closed(
    ex: StepExecutor,
    try_: _Try,
    limit: int,
    outcome: str,
    error: dict[str, Any],
    fields: dict[str, Any],
) -> tuple[bool, Any]:
    """Close the timed-out invocation as ``outcome`` (``lost``: reconcile found nothing;
    ``timeout``: an idempotent tool's), the try finished as retryable; then the backoff and
    ``(False, None)`` when a try is left.

    Raises:
        StepFailed: none is left.
    """
    finished: tuple[Item, Item] = (
        (
            "tool_invocation_finished",
            {
                **try_.base,
                "invocation_id": try_.invocation,
                "idempotency_key": try_.key,
                "outcome": outcome,
                "error": error,
                **fields,
            },
        ),
        (
            "node_finished",
            {
                **try_.base,
                "result_type": "retryable_failure",
                "error": error,
                "attempt": try_.attempt,
                "duration_ms": elapsed_ms(try_.t0),
            },
        ),
    )
    ex.journal.tx_retrying(False, record_failure, ex, try_.key, finished, error)
    ex.grants.pop(try_.key, None)
    if try_.attempt < limit:
        ex.backoff(try_.attempt)
        return False, None
    raise StepFailed(try_.spec.node_id, error)
