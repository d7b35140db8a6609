"""The checks and payloads of an agent's waits (``ctx.wait``, ``ctx.approval``,
``ctx.sleep``): what :class:`~affidavit.runtime._agent_runner.AgentRun` validates before it
records a wait, what the wait records, and when its timer is due (pure: nothing reads or writes
the store) — and the wait step itself (:func:`wait_step`), run through the run's journal."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from affidavit.core import crash
from affidavit.core.approvals import ApprovalPolicy
from affidavit.core.errors import StoreError
from affidavit.runtime._run_base import Item, StepFailed, Stop

if TYPE_CHECKING:
    from affidavit.runtime._agent_runner import AgentRun
    from affidavit.runtime._step_executor import StepSpec

MAX_WAIT_KEY = 200


def check_wait(key: Any, timeout: Any) -> None:
    """Refuse a wait key that is not text of 1 to :data:`MAX_WAIT_KEY` characters, or a
    timeout that is not a number ≥ 0 (``None``: no timeout)."""
    if not isinstance(key, str) or not key or len(key) > MAX_WAIT_KEY:
        raise ValueError(f"a wait key must be text of 1 to {MAX_WAIT_KEY} characters")
    if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
        raise ValueError(f"timeout_seconds must be a number ≥ 0, not {timeout!r}")


def check_sleep(seconds: Any) -> None:
    """Refuse a sleep that is not a number of seconds ≥ 0."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
        raise ValueError(f"ctx.sleep takes seconds ≥ 0, not {seconds!r}")


def wait_extra(
    kind: str, args: dict[str, Any], timeout: float | None
) -> tuple[dict[str, Any], float | None]:
    """What a wait of ``kind`` records beyond its key (an approval: who may decide it, checked
    by ``ctx.approval``; a timeout: its ``wake_at``), and the time it wakes at (``None``: no
    timeout)."""
    extra: dict[str, Any] = {}
    if kind == "approval":
        extra.update(
            ApprovalPolicy.parse(args.get("approvers"), args.get("min_approvals"), "").to_dict()
        )
    wake_at: float | None = None
    if timeout is not None:
        wake_at = time.time() + float(timeout)
        extra["wake_at"] = rfc3339(wake_at)
    return extra, wake_at


def timer_due(recorded: dict[str, Any]) -> float | None:
    """When a recorded wait's timer is due (its ``wake_at``), ``None`` for a wait without a
    readable one."""
    wake = recorded.get("wake_at")
    if not isinstance(wake, str):
        return None
    try:
        return datetime.fromisoformat(wake).timestamp()
    except ValueError:
        return None


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def wait_step(
    run: AgentRun,
    spec: StepSpec,
    key: str,
    wait_type: str,
    extra: dict[str, Any],
    wake_at: float | None,
    called: Item | None,
) -> Any:
    """Run the agent's wait step ``spec`` (a signal, approval or timer wait keyed ``key``):
    its recorded result on replay, else the wait recorded (or completed by its timer)."""
    if spec.node_id in run.replay.completed_nodes:
        crash.crash_point("agent.replay_step")
        return run.replay.node_output(spec.node_id)
    recorded = run.replay.waits.get(key)
    if recorded is not None and key not in run.replay.completed_waits:
        due = _fire_timer(run, spec, key, recorded)
        if due is not None:  # claimed before its timer (another host's clock): wait on
            try:
                stopped = run.journal.wait(wake_at=due)
            except (Stop, StoreError) as exc:
                raise run.end(exc) from None
            raise run.interrupted(stopped)
    try:
        return run.executor.run_wait(
            spec,
            correlation_key=key,
            wait_type=wait_type,
            reason=f"agent {run.agent.name!r}: {spec.kind} {key!r}",
            extra=extra,
            wake_at=wake_at,
            prelude=(run.plain(called),) if called else (),
        )
    except Stop as stop:
        if stop.status == "waiting" and recorded is None:
            crash.crash_point("sleep.after_record" if wait_type == "timer" else "wait.after_record")
        raise run.interrupted(stop) from None
    except (StepFailed, StoreError) as exc:
        raise run.end(exc) from None


def _fire_timer(run: AgentRun, spec: StepSpec, key: str, recorded: dict[str, Any]) -> float | None:
    """A recorded wait with a ``wake_at`` that has passed (a sleep, or a wait's timeout)
    is completed by its timer: ``wait_completed`` with ``signalled_by: "timer"``. Returns
    the time it is due when that is still to come (``None`` otherwise)."""
    due = timer_due(recorded)
    if due is None:
        return None
    if time.time() < due:
        return due
    completed = {
        "node_id": spec.node_id,
        "correlation_key": key,
        "payload": None,
        "signalled_by": "timer",
    }
    run.write_or_interrupt(("wait_completed", completed))
    run.replay.completed_waits[key] = completed
    return None
