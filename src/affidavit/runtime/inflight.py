"""Recovery on pickup and after failures: confirmation of recorded side effects, compensation,
and invocations left in flight by a dead attempt."""

from __future__ import annotations

import time
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.plan import Node, external_key
from affidavit.runtime.confirm import ConfirmationContext, Mismatch, confirm_changes
from affidavit.runtime.run_base import (
    RunBase,
    StepFailed,
    Stop,
    check_result,
    error_dict,
)
from affidavit.runtime.sdk import Tool, ToolContext
from affidavit.store._ledger import LedgerRow


def _ledger_open(tx: Any, job_id: str) -> list[LedgerRow]:
    return list(tx.ledger_open(job_id))


class RecoveryMixin(RunBase):
    def _recorded_failure(self) -> tuple[str, dict[str, Any]] | None:
        """The step failure an earlier attempt recorded and then died before failing the job
        (the worker was killed between the two, or while compensating): the node and the
        error the job fails with. ``None`` when no recorded failure ends the job.

        A step's failure is final when it is its latest attempt's outcome and is permanent,
        retryable with no attempt left, compensatable, or compensated (``compensated`` counts
        as completed: it is never run again). The job then fails as the run that recorded it
        would have: that step does not run again, and no other step starts. A compensatable
        failure whose compensation was not recorded is not compensated again blindly — the
        compensation may have acted — and the job fails saying so."""
        replay = self.replay
        if not replay.failures:
            return None
        for node_id in self.plan.order:
            finished = replay.node_finished.get(node_id)
            if finished is None or finished.get("attempt") != replay.node_attempts.get(node_id):
                continue  # not finished, or a later attempt started after it
            result_type = finished["result_type"]
            failure = replay.failures.get(node_id)
            if failure is None:
                continue
            error = failure.get("error") or {"type": result_type, "message": "step failed"}
            if result_type in ("compensated", "permanent_failure"):
                return node_id, error
            node = self.plan.node(node_id)
            t = self.tools.get(node.tool or "")
            if result_type == "compensatable_failure":
                if t is None or t.compensate_fn is None:
                    return node_id, error
                return node_id, {
                    "type": "compensation_interrupted",
                    "message": f"step {node_id!r} failed and the run stopped before its "
                    "compensation was recorded: the compensation may or may not have run",
                    "error": error,
                }
            limit = (t.retry if t is not None else None) or self.max_attempts
            if result_type == "retryable_failure" and replay.node_attempts[node_id] >= limit:
                return node_id, error
        return None

    def _confirm_recorded(self, completed: set[str]) -> None:
        """Confirmation replay (see :mod:`affidavit.runtime.confirm`): before the recorded
        results of committed tool steps are injected, ask the verifiers registered for the
        resources those steps changed. Returns when the world matches (or a mismatch is only
        warned about); parks or fails the job otherwise (raising :class:`Stop`)."""
        replay = self.replay
        verifiers = self.tools.verifiers
        if not verifiers or not replay.state_changes:
            return
        mismatches: list[Mismatch] = []
        for node_id in self.plan.order:
            step = self.steps[node_id]
            changes = replay.state_changes.get(step)
            if not changes or node_id not in completed or step in replay.accepted_steps:
                continue
            key = next(
                (
                    k
                    for k, inv in replay.invocations.items()
                    if inv.node_id == node_id and inv.committed
                ),
                None,
            )
            ctx = ConfirmationContext(
                self.claim.job_id, node_id, step, key, replay.node_output(node_id)
            )
            found = confirm_changes(verifiers, ctx, changes)
            self.metrics.confirmations.labels("mismatch" if found else "match").inc()
            mismatches += found
        if not mismatches:
            return
        if self.replay_verification == "warn":
            self._write(
                *[
                    (
                        "confirmation_warning",
                        {
                            "node_id": m.node_id,
                            "step_id": m.step_id,
                            "resource": m.resource,
                            "reason": m.reason,
                        },
                    )
                    for m in mismatches
                ]
            )
            for m in mismatches:
                self.metrics.confirmation_warnings.labels(m.resource["resource_type"]).inc()
            return
        first = mismatches[0]
        detail = {"mismatches": [m.to_dict() for m in mismatches]}
        if self.replay_verification == "human":
            raise self._park(
                "replay_verification", node_id=first.node_id, step_id=first.step_id, detail=detail
            )
        error = {
            "type": "replay_verification",
            "message": f"the world no longer matches what step {first.node_id!r} recorded: "
            f"{first.reason}",
            **detail,
        }
        # as when a job fails on pickup for a recorded failure: what an open invocation did is
        # recorded as committed first, the rest closed as lost with the job
        self._catch_up_open()
        self._fail_job(first.node_id, error)
        raise Stop("failed")

    def _compensate(
        self,
        node: Node,
        t: Tool,
        ctx: ToolContext,
        args: dict[str, Any],
        base: dict[str, Any],
        attempt: int,
    ) -> None:
        if t.compensate_fn is None:
            return
        self._confirm_lease()
        ctx.close(
            f"the compensation of step {node.id!r} is recorded from what it returns "
            "(step_compensated), not as state changes"
        )
        try:
            details = self._call(node, t.compensate_fn, ctx, args)
            canonical(details)
        except Exception as exc:
            raise StepFailed(
                node.id,
                {
                    "type": "compensation_failed",
                    "message": f"compensation of {node.id!r} failed: {error_dict(exc)['message']}",
                },
            ) from exc
        self._write(
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

    def _reconcile(
        self, node: Node, t: Tool, args: dict[str, Any], key: str, row: LedgerRow, attempt: int
    ) -> tuple[tuple[Any] | None, dict[str, Any] | None]:
        """Ask ``t``'s reconcile hook whether the invocation a dead attempt left open (``row``)
        acted, with that attempt's external key. An effect found is committed at once as a
        catch-up (``((result,), None)``); ``(None, None)`` when the hook found nothing,
        ``(None, error)`` when the lookup itself failed. Nothing is written then."""
        assert t.reconcile_fn is not None
        job_id = self.claim.job_id
        ctx = ToolContext(
            job_id,
            node.id,
            row.step_id,
            attempt,
            key,
            external_key(job_id, row.step_id, row.attempt_id),
        )
        t0 = time.perf_counter()
        try:
            found = self._call(node, t.reconcile_fn, ctx, args)
            if found is not None:
                check_result(node, t, found)
        except Exception as exc:  # the lookup failed (or timed out): decided as without a hook
            return None, error_dict(exc)
        if found is None:
            return None, None
        output = self._commit(
            tx_durable=False,
            node=node,
            base={"node_id": node.id, "step_id": row.step_id},
            key=key,
            invocation=row.invocation_id,
            result=found,
            attempt=attempt,
            t0=t0,
            ctx=ctx,
            catch_up=True,
        )
        return (output,), None

    def _catch_up_open(self) -> None:
        """Before a job fails on pickup (see :meth:`_recorded_failure`, and a ``strict``
        confirmation mismatch in :meth:`_confirm_recorded`): ask the reconcile hook
        of each tool whose invocation a dead attempt left open, and record every effect found
        as committed (a catch-up), so that what happened in the world is in the log as having
        happened. The rest stays open and is closed as ``lost`` with the job; no tool is
        called."""
        pending = self.replay.pending_tool_invocations
        if not pending:
            return
        job_id = self.claim.job_id
        rows = {r.idempotency_key: r for r in self._tx_retrying(False, _ledger_open, job_id)}
        for key, started in pending.items():
            node = self.plan.node(started["node_id"])
            t = self.tools.get(node.tool or "")
            row = rows.get(key)
            if t is None or t.kind != "tool" or t.reconcile_fn is None or row is None:
                continue
            try:
                args, _ = self._resolve_args(node)
            except StepFailed:
                continue  # the hook cannot be asked: closed as lost
            self._reconcile(node, t, args, key, row, self.replay.node_attempts.get(node.id, 1))

    def _in_flight(
        self,
        node: Node,
        t: Tool,
        args: dict[str, Any],
        key: str,
        row: LedgerRow,
        attempt: int,
        started_events: tuple[tuple[str, dict[str, Any]], ...],
    ) -> tuple[Any] | None:
        """Resolve an invocation that a dead attempt started and never finished. Returns
        ``(result,)`` when reconcile found the effect (caught up), ``None`` when it found
        nothing (the dead invocation is closed as lost and ours is started); parks or fails
        the job otherwise (raising)."""
        job_id = self.claim.job_id
        base = {"node_id": node.id, "step_id": row.step_id}
        dead = row.invocation_id
        # What is decided about the dead invocation is its attempt's outcome (its node_started
        # is the latest), as a person's decision on it is; ``attempt`` is the next one's.
        dead_attempt = self.replay.node_attempts.get(node.id, attempt)
        reconcile_error: dict[str, Any] | None = None
        if t.reconcile_fn is not None:
            found, reconcile_error = self._reconcile(node, t, args, key, row, dead_attempt)
            if found is not None:
                return found
            if reconcile_error is None:
                invocation = started_events[1][1]["invocation_id"]

                def restart(tx: Any) -> None:
                    self._append(
                        tx,
                        (
                            "tool_invocation_finished",
                            {
                                **base,
                                "invocation_id": dead,
                                "idempotency_key": key,
                                "outcome": "lost",
                                "error": {"type": "lost", "message": "reconcile found no effect"},
                                "catch_up": True,
                            },
                        ),
                        *started_events,
                    )
                    tx.ledger_restart(
                        job_id, key, invocation_id=invocation, attempt_id=self.claim.attempt_id
                    )

                self._tx_retrying(True, restart)
                return None
        policy = t.in_flight or self.in_flight_policy
        detail: dict[str, Any] = {
            "invocation_id": dead,
            "dead_attempt_id": row.attempt_id,
            "tool_name": t.name,
            "message": "the tool may or may not have acted; it has no reconcile hook",
        }
        if reconcile_error is not None:
            detail["message"] = "the tool may or may not have acted; its reconcile hook failed"
            detail["reconcile_error"] = reconcile_error
        if policy == "park":
            raise self._park(
                "in_flight",
                node_id=node.id,
                step_id=row.step_id,
                detail=detail,
                idempotency_key=key,
            )
        error = {**detail, "type": "in_flight", "message": "invocation in flight or lost"}

        def fail(tx: Any) -> None:
            self._close_open(tx, keep=key)
            self._append(
                tx,
                (
                    "tool_invocation_finished",
                    {
                        **base,
                        "invocation_id": dead,
                        "idempotency_key": key,
                        "outcome": "lost",
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
                ("job_failed", {"error": error, "node_id": node.id}),
            )
            tx.ledger_finish(job_id, key, status="failed", error=error)
            tx.update_job(job_id, status="failed", error=error, fence=self.claim.attempt_id)
            self.sealer.seal_txn(tx, job_id)

        self._tx_retrying(True, fail)
        raise Stop("failed")
