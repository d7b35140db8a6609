"""What a run does about the past before it runs anything new: a step failure recorded by a
run that died before failing the job, confirmation replay of recorded side effects, catching up
invocations a dead attempt left open, and crash loops.

Used by the plan runner and the agent runner alike; they tell it their steps through a
:class:`StepSource`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from affidavit.record import ReplayContext
from affidavit.runtime._confirm import ConfirmationContext, Mismatch, confirm_changes
from affidavit.runtime._journal import Journal
from affidavit.runtime._metrics import RuntimeMetrics
from affidavit.runtime._run_base import StepFailed, Stop
from affidavit.runtime._sdk import ToolRegistry
from affidavit.runtime._step_executor import StepExecutor, StepPolicy, StepSpec
from affidavit.store import LedgerRow, StoredEvent, Transaction


class StepSource(Protocol):
    """The steps of a job, as its runner knows them."""

    def step_order(self) -> Sequence[str]:
        """Node ids in the order the job runs them (plan: the canonical topological order;
        agent: the recorded sequence)."""
        ...

    def spec(self, node_id: str) -> StepSpec:
        """The identity of a node's step."""
        ...

    def step_args(self, node_id: str) -> dict[str, Any]:
        """The node's arguments as its tool was (or will be) called with them.

        Raises:
            StepFailed: they cannot be known.
        """
        ...


def _ledger_open(tx: Transaction, job_id: str) -> list[LedgerRow]:
    return list(tx.ledger_open(job_id))


class Recovery:
    """The recovery of one run (see the module's docstring)."""

    def __init__(
        self,
        journal: Journal,
        executor: StepExecutor,
        steps: StepSource,
        replay: ReplayContext,
        tools: ToolRegistry,
        policy: StepPolicy,
        metrics: RuntimeMetrics,
    ) -> None:
        self.journal = journal
        self.executor = executor
        self.steps = steps
        self.replay = replay
        self.tools = tools
        self.policy = policy
        self.metrics = metrics

    def count_recovery(
        self,
        events: list[StoredEvent],
        limit: int,
        next_node: str | None,
        last_node: str | None,
    ) -> None:
        """This run recovers a job whose run before ended without finishing or handing it
        back: count it — one more in a row when no node finished since the recovery before
        (the runs between recorded no step's outcome), else the first — and park the job
        instead of running it once the count passes ``limit``. ``next_node``: the node the
        run would start with (``None``: it would finish the job; the park names
        ``last_node`` then).

        Raises:
            Stop: parked (reason ``crash_loop``).
        """
        progress = sum(1 for e in events if e.type == "node_finished")
        claim = self.journal.claim
        count = claim.recoveries + 1 if claim.progress == progress else 1
        if count > limit:
            where = f"inside step {next_node!r}" if next_node else "while finishing the job"
            named = next_node or last_node
            raise self.journal.park(
                "crash_loop",
                node_id=named,
                step_id=self.steps.spec(named).step_id if named is not None else None,
                detail={
                    "recoveries": count,
                    "max_recoveries": limit,
                    "message": f"the job's last {count} runs ended without finishing or "
                    f"handing it back, and no step recorded an outcome: the worker was killed "
                    f"(out of memory?), exited {where}, or lost the lease (frozen, or too busy "
                    "to renew it: a longer --lease-seconds helps); parked so that it does not "
                    "take down every worker",
                },
            )
        self.journal.tx_retrying(
            False, lambda tx: tx.set_recoveries(claim.job_id, claim.attempt_id, count, progress)
        )

    def recorded_failure(self) -> tuple[str, dict[str, Any]] | None:
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
        for node_id in self.steps.step_order():
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
            t = self.tools.get(self.steps.spec(node_id).tool or "")
            if result_type == "compensatable_failure":
                if t is None or t.compensate_fn is None:
                    return node_id, error
                return node_id, {
                    "type": "compensation_interrupted",
                    "message": f"step {node_id!r} failed and the run stopped before its "
                    "compensation was recorded: the compensation may or may not have run",
                    "error": error,
                }
            limit = (t.retry if t is not None else None) or self.policy.max_attempts
            if result_type == "retryable_failure" and replay.node_attempts[node_id] >= limit:
                return node_id, error
        return None

    def confirm_recorded(self, completed: set[str]) -> None:
        """Confirmation replay (see :mod:`affidavit.runtime._confirm`): before the recorded
        results of committed tool steps are injected, ask the verifiers registered for the
        resources those steps changed. Returns when the world matches (or a mismatch is only
        warned about); parks or fails the job otherwise (raising :class:`Stop`)."""
        replay = self.replay
        verifiers = self.tools.verifiers
        if not verifiers or not replay.state_changes:
            return
        mismatches: list[Mismatch] = []
        for node_id in self.steps.step_order():
            step = self.steps.spec(node_id).step_id
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
                self.journal.job_id, node_id, step, key, replay.node_output(node_id)
            )
            found = confirm_changes(verifiers, ctx, changes)
            self.metrics.confirmations.labels("mismatch" if found else "match").inc()
            mismatches += found
        if not mismatches:
            return
        if self.policy.replay_verification == "warn":
            self.journal.write(
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
        if self.policy.replay_verification == "human":
            raise self.journal.park(
                "replay_verification", node_id=first.node_id, step_id=first.step_id, detail=detail
            )
        error = {
            "type": "replay_verification",
            "message": f"the world no longer matches what step {first.node_id!r} recorded: "
            f"{first.reason}",
            **detail,
        }
        # as when a job fails on pickup for a recorded failure: what an open invocation did is
        # recorded as committed first, the rest closed as unknown with the job
        self.catch_up_open()
        self.journal.fail_job(first.node_id, error)
        raise Stop("failed")

    def catch_up_open(self) -> None:
        """Before a job fails on pickup (see :meth:`recorded_failure`, and a ``strict``
        confirmation mismatch in :meth:`confirm_recorded`): ask the reconcile hook of each tool
        whose invocation a dead attempt left open, and record every effect found as committed
        (a catch-up), so that what happened in the world is in the log as having happened. The
        rest stays open and is closed as ``unknown`` with the job; no tool is called."""
        pending = self.replay.pending_tool_invocations
        if not pending:
            return
        rows = {
            r.idempotency_key: r
            for r in self.journal.tx_retrying(False, _ledger_open, self.journal.job_id)
        }
        for key, started in pending.items():
            node_id = started["node_id"]
            spec = self.steps.spec(node_id)
            t = self.tools.get(spec.tool or "")
            row = rows.get(key)
            if t is None or t.kind != "tool" or t.reconcile_fn is None or row is None:
                continue
            try:
                args = self.steps.step_args(node_id)
            except StepFailed:
                continue  # the hook cannot be asked: closed as lost
            self.executor.reconcile(
                spec, t, args, key, row, self.replay.node_attempts.get(node_id, 1)
            )

    def fail_recorded(self) -> bool:
        """When a recorded failure ends the job (:meth:`recorded_failure`): catch up what
        open invocations did and fail the job; ``True`` then."""
        recorded = self.recorded_failure()
        if recorded is None:
            return False
        self.catch_up_open()
        self.journal.fail_job(*recorded)
        return True
