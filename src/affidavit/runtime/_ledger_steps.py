"""The two transactions of a tool step around its call, against the invocation ledger:

- T1 (:func:`acquire`): the ledger row for the idempotency key, an insert only one attempt can
  win, and ``node_started`` + ``tool_invocation_started`` when this attempt may execute;
- T2 (:func:`commit`): ``tool_invocation_finished``, ``command_committed``, ``state_changed``,
  ``node_finished`` and the row marked committed — or, for a failed try
  (:func:`record_failure`), its finished events and the row marked failed, and the
  compensation of a compensatable failure (:func:`compensate`).

Every write goes through the run's :class:`~affidavit.runtime._journal.Journal`, fenced by the
claim's attempt id. The executor (:mod:`affidavit.runtime._step_executor`) decides when each
runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from affidavit.core.canonical import canonical, parse, sha256_hex
from affidavit.runtime._limits import release_in
from affidavit.runtime._run_base import Item, StepFailed, elapsed_ms, error_dict, recorded
from affidavit.runtime._sdk import Tool, ToolContext
from affidavit.store import LedgerRow, Transaction

if TYPE_CHECKING:
    from affidavit.runtime._step_executor import StepExecutor, StepSpec


def acquire(
    tx: Transaction,
    ex: StepExecutor,
    spec: StepSpec,
    tool_name: str,
    key: str,
    hashed_args: str,
    invocation: str,
    started_events: tuple[Item, ...],
    started_ids: list[str],
    presumed_new: bool,
) -> LedgerRow | None:
    """T1's writes: the ledger row only one attempt can win, and the started events when
    this attempt may execute. Returns the row found instead of inserted (``None`` when the
    insert won). ``presumed_new``: see :meth:`Transaction.ledger_insert`."""
    job_id = ex.job_id
    claim = ex.journal.claim
    # The insert comes first: on the usual path (a key never seen) it is the only ledger
    # statement of T1.
    inserted = tx.ledger_insert(
        job_id=job_id,
        key=key,
        node_id=spec.node_id,
        step_id=spec.step_id,
        tool_name=tool_name,
        args_hash=hashed_args,
        invocation_id=invocation,
        attempt_id=claim.attempt_id,
        presumed_new=presumed_new,
    )
    row: LedgerRow | None = None if inserted else tx.ledger_get(job_id, key)
    if row is None:
        ex.journal.append(tx, *started_events, fast=True, ids=started_ids)
    elif row.status == "failed":
        tx.ledger_restart(job_id, key, invocation_id=invocation, attempt_id=claim.attempt_id)
        ex.journal.append(tx, *started_events, fast=True)
    return row


def record_failure(
    tx: Transaction, ex: StepExecutor, key: str, items: tuple[Item, Item], error: dict[str, Any]
) -> None:
    """A failed attempt's T2: its finished events, and its ledger row marked failed (so a
    retry may run the tool again)."""
    ex.journal.append(tx, *items)
    tx.ledger_finish(ex.job_id, key, status="failed", error=error)
    if ex.grants:
        release_in(tx, ex.grants.get(key))


def commit(
    ex: StepExecutor,
    *,
    durable: bool,
    spec: StepSpec,
    key: str,
    invocation: str,
    result: Any,
    attempt: int,
    t0: float,
    ctx: ToolContext | None,
    catch_up: bool,
    step_id: str | None = None,
    result_jcs: bytes | None = None,
    timed_out: dict[str, Any] | None = None,
) -> Any:
    """T2 (or a catch-up's commit). Returns the result as recorded — read back from its
    canonical bytes, as a replay reads it — for the steps that take it as their input.
    ``timed_out``: the fields of a call that ran past its time limit and was resolved by the
    tool's reconcile hook (``timeout_seconds``, ``resolution``)."""
    base = {"node_id": spec.node_id, "step_id": step_id or spec.step_id}
    jcs = plain = result_jcs if result_jcs is not None else canonical(result)
    if ex.cipher is not None:  # a subject's job: the result is recorded (and hashed) sealed
        result = ex.cipher.seal(parse(plain))
        jcs = canonical(result)
    items: list[Item] = [
        (
            "tool_invocation_finished",
            {
                **base,
                "invocation_id": invocation,
                "idempotency_key": key,
                "outcome": "success",
                "result": orjson.Fragment(jcs),
                "catch_up": catch_up,
                **(timed_out or {}),
            },
        ),
        (
            "command_committed",
            {
                **base,
                "command_id": invocation,
                "idempotency_key": key,
                "result_hash": sha256_hex(jcs),
            },
        ),
    ]
    if ctx is not None and ctx.state_changes:
        changes = canonical([c.to_dict() for c in ctx.state_changes])
        items.append(("state_changed", {**base, "state_changes": orjson.Fragment(changes)}))
    items.append(
        (
            "node_finished",
            {
                **base,
                "result_type": "side_effect_committed",
                "attempt": attempt,
                "duration_ms": elapsed_ms(t0),
                **({"usage": ctx.usage} if ctx is not None and ctx.usage else {}),
            },
        )
    )
    if ctx is not None:
        ex.count_usage(ctx)
    ex.journal.tx_retrying(durable, _commit_txn, ex, items, key, result, jcs)
    if ex.grants:
        ex.grants.pop(key, None)
    return recorded(plain)


def _commit_txn(
    tx: Transaction, ex: StepExecutor, items: list[Item], key: str, result: Any, jcs: bytes
) -> None:
    """T2's writes: the step's closing events and its ledger row committed."""
    ex.journal.append(tx, *items, fast=True)
    tx.ledger_finish(ex.job_id, key, status="committed", result=result, result_jcs=jcs)
    if ex.grants:  # T2 ends the call's grant
        release_in(tx, ex.grants.get(key))


def compensate(
    ex: StepExecutor,
    spec: StepSpec,
    t: Tool,
    ctx: ToolContext,
    args: dict[str, Any],
    base: dict[str, Any],
    attempt: int,
) -> None:
    """A compensatable failure's compensation, when the tool has one: called under the
    confirmed lease, recorded as ``step_compensated`` and the node finished ``compensated``.

    Raises:
        StepFailed: the compensation failed.
    """
    if t.compensate_fn is None:
        return
    ex.control.confirm_lease()
    ctx.close(
        f"the compensation of step {spec.node_id!r} is recorded from what it returns "
        "(step_compensated), not as state changes"
    )
    try:
        details = ex.call(spec, t.compensate_fn, ctx, args)
        canonical(details)
    except Exception as exc:
        raise StepFailed(
            spec.node_id,
            {
                "type": "compensation_failed",
                "message": f"compensation of {spec.node_id!r} failed: {error_dict(exc)['message']}",
            },
        ) from exc
    ex.journal.write(
        ("step_compensated", {**base, "compensation": details}),
        (
            "node_finished",
            {
                **base,
                "result_type": "compensated",
                "attempt": attempt,
                "duration_ms": 0,
            },  # (no output: a tool node's; the compensation is in step_compensated)
        ),
    )
