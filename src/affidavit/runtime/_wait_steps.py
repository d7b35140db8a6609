"""A wait step of a run (:meth:`affidavit.runtime._step_executor.StepExecutor.run_wait`):
finished from the recorded ``wait_completed`` when the log holds it, else recorded and the run
ended as ``waiting``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from affidavit.core.approvals import NOT_APPROVED
from affidavit.runtime._run_base import Item, StepFailed, Stop

if TYPE_CHECKING:
    from affidavit.runtime._step_executor import StepExecutor, StepSpec


def run_wait(
    ex: StepExecutor,
    spec: StepSpec,
    *,
    correlation_key: str,
    wait_type: str,
    reason: str,
    extra: Mapping[str, Any] | None,
    wake_at: float | None,
    prelude: tuple[Item, ...],
) -> Any:
    """See :meth:`~affidavit.runtime._step_executor.StepExecutor.run_wait`."""
    done = ex.replay.completed_waits.get(correlation_key)
    base = {"node_id": spec.node_id, "step_id": spec.step_id}
    if done is not None:
        payload = done.get("payload")
        approved = not (
            wait_type == "approval"
            and isinstance(payload, dict)
            and payload.get("approved") is False
        )
        finished: dict[str, Any] = {
            **base,
            "attempt": 1,
            "result_type": "pure" if approved else "permanent_failure",
            "duration_ms": 0,
        }
        if approved:
            finished["output"] = payload
        else:
            finished["error"] = dict(NOT_APPROVED)
        ex.journal.write(*prelude, ("node_finished", finished))
        if not approved:
            # (the error recorded: a recovery that ends the job from the log says the same)
            raise StepFailed(spec.node_id, dict(NOT_APPROVED))
        return payload
    if correlation_key not in ex.replay.waits:
        started = {**base, "attempt": 1, "worker_id": ex.journal.claim.worker_id}
        waiting = {
            "node_id": spec.node_id,
            "wait_type": wait_type,
            "correlation_key": correlation_key,
            "reason": reason,
            **(extra or {}),
        }
        raise ex.journal.wait(
            *prelude, ("node_started", started), ("job_waiting", waiting), wake_at=wake_at
        )
    raise Stop("waiting")
