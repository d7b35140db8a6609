"""One builder per kind of finished job, for plan and agent jobs: each runs a real job to its
end in-process with the Runtime API (the crash scenarios kill a real worker subprocess at a
crash point of affidavit.core.crash) and returns its id and final status."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from affidavit import Runtime, ToolRegistry
from tests.packs import pack_tools as T
from tests.runtime import crash_tools
from tests.runtime.helpers import run_driver, wait_lease_expired


@dataclass
class Env:
    """What a builder gets: the database, a runtime factory and a directory of its own."""

    url: str
    tmp: Path
    make: Callable[[ToolRegistry], Runtime]

    def rt(self) -> Runtime:
        return self.make(T.REGISTRY)

    def crash_rt(self) -> Runtime:
        return self.make(crash_tools.REGISTRY)


Builder = Callable[[Env], str]


def _run(rt: Runtime, job_id: str, status: str) -> str:
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == status, (job.status, job.error)
    return job_id


def _waiting(rt: Runtime, target: Any, input: dict[str, Any]) -> str:
    job_id = rt.submit(target, input).job_id
    _run(rt, job_id, "waiting")
    return job_id


# --- approvals and signals ---------------------------------------------------------------------


def _answered(target: Any, key: Callable[[str], str], payload: Any, status: str) -> Builder:
    def build(env: Env) -> str:
        rt = env.rt()
        job_id = _waiting(rt, target, {"amount": 30})
        # (an approval is decided by a principal other than the submitter: the operator ann)
        rt.signal(job_id, key(job_id), payload, by="ann", approver="ann")
        return _run(rt, job_id, status)

    return build


def _plan_key(node: str) -> Callable[[str], str]:
    return lambda job_id: f"{job_id}:{node}"


def _agent_key(key: str) -> Callable[[str], str]:
    return lambda job_id: key


APPROVE = {"approved": True, "comment": "fine"}
REJECT = {"approved": False, "comment": "too much"}


# --- sleeps and timeouts (agent jobs: durable timers) --------------------------------------------


def _timer(agent: str) -> Builder:
    def build(env: Env) -> str:
        rt = env.rt()
        job_id = rt.submit(agent, {"amount": 5}).job_id
        for _ in range(5):  # the timer is due at once: the next claim fires it
            rt.run_until_idle()
            if rt.get_job(job_id).terminal:
                break
        return _run(rt, job_id, "completed")

    return build


# --- cancellations -----------------------------------------------------------------------------


def _cancel_pending(target: Any) -> Builder:
    def build(env: Env) -> str:
        rt = env.rt()
        job_id = rt.submit(target, {"amount": 5}).job_id
        rt.cancel(job_id, reason="not needed", by="ann")
        return job_id

    return build


def _cancel_waiting(target: Any) -> Builder:
    def build(env: Env) -> str:
        rt = env.rt()
        job_id = _waiting(rt, target, {"amount": 5})
        rt.cancel(job_id, reason="no answer", by="ann")
        return job_id

    return build


def _cancel_running(target: Any) -> Builder:
    def build(env: Env) -> str:
        rt = env.rt()
        job_id = rt.submit(target, {"amount": 5, "db": env.url}).job_id
        return _run(rt, job_id, "cancelled")

    return build


# --- retries, failures, compensations -----------------------------------------------------------


def _finishes(target: Any, status: str) -> Builder:
    def build(env: Env) -> str:
        rt = env.rt()
        return _run(rt, rt.submit(target, {"amount": 5}).job_id, status)

    return build


# --- crashes: recoveries and parks ---------------------------------------------------------------


def _crashed(env: Env, rt: Runtime, target: Any, point: str) -> str:
    """Submit ``target`` and kill a real worker process at ``point`` while it runs the job;
    return once the dead worker's lease has run out."""
    side = env.tmp / "side.jsonl"
    args: dict[str, Any] = {"side": str(side), "amount": 10}
    if not isinstance(target, dict):  # an agent: (name, its arguments)
        target, extra = target
        args.update(extra)
    job_id = rt.submit(target, args).job_id
    proc = run_driver(env.url, "--job", job_id, "--lease", "0.5", crash=point)
    assert proc.returncode == -9, f"the worker did not die by SIGKILL: {proc}"
    wait_lease_expired(rt.store, job_id)
    return job_id


def _recovered(target: Any, point: str, computes: int = 1) -> Builder:
    """Killed at ``point``, recovered by the next worker; ``computes``: how often the pure
    step really ran (twice when the crash came after it ran and before it was recorded)."""

    def build(env: Env) -> str:
        rt = env.crash_rt()
        job_id = _crashed(env, rt, target, point)
        for _ in range(5):  # a sleep's timer is due at once: the next claim fires it
            rt.run_until_idle()
            if rt.get_job(job_id).terminal:
                break
        _run(rt, job_id, "completed")
        ran = crash_tools.counts(env.tmp / "side.jsonl", "compute")
        assert sum(n for (job, _), n in ran.items() if job == job_id) == computes
        return job_id

    return build


def _parked(target: Any, decision: str, status: str) -> Builder:
    """Killed between acquiring an invocation and running a tool without a reconcile hook:
    recovery parks the job; a person resolves it with ``decision``."""

    def build(env: Env) -> str:
        rt = env.crash_rt()
        job_id = _run(rt, _crashed(env, rt, target, "tool.after_acquire"), "parked")
        result = {"charge_id": "by-hand", "amount": 10} if decision == "accept_result" else None
        rt.resume(job_id, decision, result=result, by="ann", note="looked it up")
        if decision == "fail":
            assert rt.get_job(job_id).status == status
            return job_id
        return _run(rt, job_id, status)

    return build


PLAN_CRASH = crash_tools.charge_plan("crash_charge")
PLAN_CRASH_NR = crash_tools.charge_plan("crash_charge_nr")
AGENT_CRASH = ("crash_agent", {"tool_name": "crash_charge"})
AGENT_CRASH_NR = ("crash_agent", {"tool_name": "crash_charge_nr"})
AGENT_CRASH_SLEEP = ("crash_agent", {"tool_name": "crash_charge", "sleep": 0})

# kind -> (plan job builder, agent job builder); None: the kind does not exist for that job
SCENARIOS: dict[str, tuple[Builder | None, Builder | None]] = {
    "approved": (
        _answered(T.APPROVAL_PLAN, _plan_key("ok"), APPROVE, "completed"),
        _answered("pk_approval_agent", _agent_key("big"), APPROVE, "completed"),
    ),
    "rejected": (
        _answered(T.APPROVAL_PLAN, _plan_key("ok"), REJECT, "failed"),
        _answered("pk_approval_agent", _agent_key("big"), REJECT, "failed"),
    ),
    "signalled": (
        _answered(T.SIGNAL_PLAN, _plan_key("go"), {"go": 1}, "completed"),
        _answered("pk_signal_agent", _agent_key("go"), {"go": 1}, "completed"),
    ),
    "slept": (None, _timer("pk_sleep_agent")),
    "wait_timed_out": (None, _timer("pk_timeout_agent")),
    "retried": (
        _finishes(T.RETRY_PLAN, "completed"),
        _finishes("pk_retry_agent", "completed"),
    ),
    "failed": (_finishes(T.FAILED_PLAN, "failed"), _finishes("pk_failed_agent", "failed")),
    "compensated": (
        _finishes(T.COMPENSATION_PLAN, "failed"),
        _finishes("pk_compensation_agent", "failed"),
    ),
    "cancelled_pending": (
        _cancel_pending(T.PENDING_PLAN),
        _cancel_pending("pk_pending_agent"),
    ),
    "cancelled_waiting": (
        _cancel_waiting(T.APPROVAL_PLAN),
        _cancel_waiting("pk_approval_agent"),
    ),
    "cancelled_running": (
        _cancel_running(T.RUNNING_CANCEL_PLAN),
        _cancel_running("pk_running_cancel_agent"),
    ),
    "recovered": (
        _recovered(PLAN_CRASH, "tool.after_execute"),
        _recovered(AGENT_CRASH, "tool.after_execute"),
    ),
    "recovered_pure": (
        _recovered(PLAN_CRASH, "pure.after_execute", computes=2),
        _recovered(AGENT_CRASH, "pure.after_execute", computes=2),
    ),
    "recovered_finishing": (
        _recovered(PLAN_CRASH, "job.before_complete"),
        _recovered(AGENT_CRASH, "job.before_complete"),
    ),
    "recovered_asleep": (None, _recovered(AGENT_CRASH_SLEEP, "sleep.after_record")),
    "parked_retried": (
        _parked(PLAN_CRASH_NR, "retry", "completed"),
        _parked(AGENT_CRASH_NR, "retry", "completed"),
    ),
    "parked_accepted": (
        _parked(PLAN_CRASH_NR, "accept_result", "completed"),
        _parked(AGENT_CRASH_NR, "accept_result", "completed"),
    ),
    "parked_failed": (
        _parked(PLAN_CRASH_NR, "fail", "failed"),
        _parked(AGENT_CRASH_NR, "fail", "failed"),
    ),
}

CASES = [
    (kind, job_kind)
    for kind, builders in SCENARIOS.items()
    for job_kind, builder in zip(("plan", "agent"), builders, strict=True)
    if builder is not None
]


def build(env: Env, kind: str, job_kind: str) -> str:
    builder = SCENARIOS[kind][0 if job_kind == "plan" else 1]
    assert builder is not None
    return builder(env)


def _has(event_type: str, **fields: Any) -> Callable[[list[Any]], bool]:
    def found(events: list[Any]) -> bool:
        return any(
            e.type == event_type and all(e.payload.get(k) == v for k, v in fields.items())
            for e in events
        )

    return found


def _count(n: int, event_type: str, **fields: Any) -> Callable[[list[Any]], bool]:
    def found(events: list[Any]) -> bool:
        hits = [
            e
            for e in events
            if e.type == event_type and all(e.payload.get(k) == v for k, v in fields.items())
        ]
        return len(hits) == n

    return found


# What each kind leaves in its job's log: the job really went that way (the crash scenarios
# also assert that the worker died by SIGKILL at the crash point).
SIGNS: dict[str, list[Callable[[list[Any]], bool]]] = {
    "approved": [_has("job_waiting", wait_type="approval"), _has("wait_completed")],
    "rejected": [_has("wait_completed"), _has("node_finished", result_type="permanent_failure")],
    "signalled": [_has("job_waiting", wait_type="signal"), _has("wait_completed")],
    "slept": [_has("job_waiting", wait_type="timer"), _has("wait_completed", signalled_by="timer")],
    "wait_timed_out": [_has("wait_completed", signalled_by="timer")],
    "retried": [_count(2, "node_finished", result_type="retryable_failure")],
    "failed": [_has("node_finished", result_type="permanent_failure"), _has("job_failed")],
    "compensated": [_has("step_compensated"), _has("node_finished", result_type="compensated")],
    "cancelled_pending": [_count(0, "node_started"), _has("job_cancelled")],
    "cancelled_waiting": [_has("job_waiting"), _has("job_cancelled")],
    # (the call in flight at the cancel finishes and is recorded; then the job ends cancelled)
    "cancelled_running": [
        _has("tool_invocation_finished", outcome="success"),
        _has("job_cancelled"),
    ],
    "recovered": [_has("tool_invocation_finished", catch_up=True, outcome="success")],
    "recovered_pure": [_has("job_completed")],
    "recovered_finishing": [_has("job_completed")],
    "recovered_asleep": [_has("wait_completed", signalled_by="timer"), _has("job_completed")],
    "parked_retried": [_has("job_parked", reason="in_flight"), _has("job_resumed")],
    "parked_accepted": [_has("job_parked", reason="in_flight"), _has("job_resumed")],
    "parked_failed": [_has("job_parked", reason="in_flight"), _has("job_failed")],
}
