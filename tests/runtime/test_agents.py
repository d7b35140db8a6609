"""Agent jobs written as code (``@affidavit.agent``), on both backends: each ``ctx`` call is one
recorded step; recovery runs the function again and recorded steps return without executing;
divergent code parks the job; versions are enforced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import affidavit
from affidavit import AgentContext, PlanError, Runtime, ToolRegistry
from affidavit.core.agent_steps import agent_hash, agent_step_id
from affidavit.core.errors import SignalRejected
from affidavit.record._replay import build_from_events
from affidavit.runtime._agent import Agent
from affidavit.runtime._submit import submit_agent_job
from tests.runtime import agent_tools as at
from tests.runtime.helpers import assert_log_sound, of_type, wait_lease_expired


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    at.CALLS.clear()
    with Runtime(store_url, tools=at.registry(), lease_seconds=30) as runtime:
        yield runtime


def calls(events: list[Any]) -> list[dict[str, Any]]:
    return of_type(events, "step_called")


def test_step_id_formula() -> None:
    import hashlib

    expected = hashlib.sha256(b"job-1\x00agent\x003\x00tool").hexdigest()[:16]
    assert agent_step_id("job-1", 3, "tool") == expected
    assert agent_step_id("job-1", 3, "pure") != expected
    assert len(agent_hash("refund_agent", "1")) == 64


def test_refund_agent_completes_with_one_step_per_call(rt: Runtime) -> None:
    job = rt.submit(at.refund_agent, {"order_id": "A-1"}, idempotency_key="k1")
    assert rt.submit("refund_agent", {"order_id": "A-1"}, idempotency_key="k1").job_id == job.job_id
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output == {"refunded": 40}
    events = assert_log_sound(rt.store, job.job_id)
    assert [e.type for e in events[:2]] == ["job_created", "agent_started"]
    created = events[0].payload
    assert created["kind"] == "agent" and created["plan_name"] == "refund_agent"
    started = events[1].payload
    assert started["agent_version"] == "1"
    assert started["agent_hash"] == agent_hash("refund_agent", "1")
    recorded = calls(events)
    assert [(c["seq"], c["kind"], c["tool_name"]) for c in recorded] == [
        (0, "tool", "ag_lookup_order"),
        (1, "pure", "ag_decide_refund"),
        (2, "tool", "ag_issue_refund"),
    ]
    for c in recorded:
        assert c["node_id"] == f"#{c['seq']}"
        assert c["step_id"] == agent_step_id(job.job_id, c["seq"], c["kind"])
    # step_called comes first, in the step's first transaction
    types = [e.type for e in events]
    first = types.index("step_called")
    assert types[first : first + 3] == ["step_called", "node_started", "tool_invocation_started"]
    assert at.CALLS == {"lookup": 1, "decide": 1, "refund": 1}
    replay = build_from_events(events)
    assert replay.kind == "agent" and sorted(replay.agent_steps) == [0, 1, 2]
    assert rt.run_until_idle() == 0  # a completed job never runs again
    assert at.CALLS == {"lookup": 1, "decide": 1, "refund": 1}


def test_approval_waits_then_recovery_returns_recorded_results(rt: Runtime) -> None:
    job = rt.submit("refund_agent", {"order_id": "BIG-7"})
    assert rt.run_job(job.job_id).status == "waiting"
    assert at.CALLS == {"lookup": 1, "decide": 1}
    with pytest.raises(SignalRejected):
        rt.signal(job.job_id, "nope", {})
    rt.signal(job.job_id, "big_refund", {"approved": True, "comment": "ops"}, approver="ops")
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output == {"refunded": 250}
    # the function ran again from the top: lookup and decide were not executed again
    assert at.CALLS == {"lookup": 1, "decide": 1, "refund": 1}
    events = assert_log_sound(rt.store, job.job_id)
    kinds = [c["kind"] for c in calls(events)]
    assert kinds == ["tool", "pure", "approval", "tool"]
    [waiting] = of_type(events, "job_waiting")
    assert waiting["correlation_key"] == "big_refund" and waiting["node_id"] == "#2"


def test_approval_denied_fails_the_job(rt: Runtime) -> None:
    job = rt.submit("refund_agent", {"order_id": "BIG-8"})
    assert rt.run_job(job.job_id).status == "waiting"
    rt.signal(job.job_id, "big_refund", {"approved": False}, approver="ops")
    done = rt.run_job(job.job_id)
    assert done.status == "failed" and done.error["type"] == "not_approved"
    assert "refund" not in at.CALLS
    assert_log_sound(rt.store, job.job_id)


def test_concurrent_calls_sync_and_async(rt: Runtime) -> None:
    job = rt.submit("fanout_agent", {"n": 5})
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output == [f"u{i}@example.com" for i in range(5)]
    events = assert_log_sound(rt.store, job.job_id)
    assert [c["seq"] for c in calls(events)] == [0, 1, 2, 3, 4]  # in the order started
    assert [c["args"]["to"] for c in calls(events)] == [f"u{i}@example.com" for i in range(5)]
    assert at.CALLS["email"] == 5

    job2 = rt.submit("async_agent", {"n": 3})
    done2 = rt.run_job(job2.job_id)
    assert done2.status == "completed", done2.error
    assert done2.output == {"order": "A-1", "sent": ["a0@x", "a1@x", "a2@x"]}
    events2 = assert_log_sound(rt.store, job2.job_id)
    assert [c["args"].get("to") for c in calls(events2)] == [None, "a0@x", "a1@x", "a2@x"]


def test_recorded_values_are_replayed(rt: Runtime) -> None:
    job = rt.submit("values_agent", {})
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    out = done.output
    assert out["job"] == job.job_id and 0 <= out["random"] < 1
    events = assert_log_sound(rt.store, job.job_id)
    assert [c["kind"] for c in calls(events)] == ["now", "uuid", "random"]
    outputs = [f["output"] for f in of_type(events, "node_finished")]
    assert outputs == [out["now"], out["uuid"], out["random"]]


def test_wait_signal_and_timeout(rt: Runtime) -> None:
    job = rt.submit("wait_agent", {})
    assert rt.run_job(job.job_id).status == "waiting"
    assert rt.run_until_idle() == 0  # nobody holds a waiting job, nothing runs it
    rt.signal(job.job_id, "go", {"x": 1})
    done = rt.run_job(job.job_id)
    assert done.status == "completed" and done.output == {"got": {"x": 1}}
    assert at.CALLS["email"] == 2

    timed = rt.submit("wait_agent", {"timeout": 0.2})
    assert rt.run_job(timed.job_id).status == "waiting"
    wait_until_runnable(rt, timed.job_id)
    assert rt.run_until_idle() == 1
    done = rt.get_job(timed.job_id)
    assert done.status == "completed" and done.output == {"got": None}
    events = assert_log_sound(rt.store, timed.job_id)
    [completed] = of_type(events, "wait_completed")
    assert completed["signalled_by"] == "timer"


def wait_until_runnable(rt: Runtime, job_id: str, timeout: float = 15.0) -> None:
    """Until the job's timer is due (its wake time, as stored, has passed)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        expires = rt.store.get_job(job_id).lease_expires_at
        if expires is not None and expires < time.time():
            return
        time.sleep(0.05)
    raise AssertionError("the timer never came due")


def test_sleep_is_a_durable_timer_no_worker_holds(rt: Runtime) -> None:
    job = rt.submit("sleep_agent", {"seconds": 0.3})
    assert rt.run_job(job.job_id).status == "waiting"
    held = rt.store.get_job(job.job_id)
    assert held.status == "waiting" and held.lease_owner is None
    with pytest.raises(SignalRejected):
        rt.signal(job.job_id, f"{job.job_id}:#1", {})
    wait_until_runnable(rt, job.job_id)
    assert rt.run_until_idle() == 1
    done = rt.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert at.CALLS["email"] == 2
    events = assert_log_sound(rt.store, job.job_id)
    [waiting] = of_type(events, "job_waiting")
    [completed] = of_type(events, "wait_completed")
    assert waiting["wait_type"] == "timer" and completed["signalled_by"] == "timer"
    assert completed["at"] >= waiting["wake_at"]


def test_retries_and_failures(rt: Runtime) -> None:
    job = rt.submit("retry_agent", {})
    done = rt.run_job(job.job_id)
    assert done.status == "completed" and done.output == {"n": 7, "attempt": 2}
    assert_log_sound(rt.store, job.job_id)

    # a pure step's failed attempt is recorded with its call, and the step is tried again
    pure_retry = rt.submit("retry_pure_agent", {})
    done = rt.run_job(pure_retry.job_id)
    assert done.status == "completed", done.error
    assert done.output == {"n": 3, "attempt": 2} and at.CALLS["flaky_pure"] == 2
    assert_log_sound(rt.store, pure_retry.job_id)

    failing = rt.submit("failing_agent", {})
    done = rt.run_job(failing.job_id)
    assert done.status == "failed" and done.error["message"] == "card declined"
    assert at.CALLS["decline"] == 1
    assert_log_sound(rt.store, failing.job_id)

    raising = rt.submit("raising_agent", {})
    done = rt.run_job(raising.job_id)
    assert done.status == "failed"
    assert done.error["type"] == "agent_error" and "own bug" in done.error["message"]


def test_divergent_code_parks_nondeterministic(store_url: str) -> None:
    at.CALLS.clear()

    def v1(ctx: AgentContext) -> Any:
        ctx.call(at.send_email, to="a@x")
        ctx.wait("go")
        return "v1"

    def v2(ctx: AgentContext) -> Any:
        ctx.call(at.send_email, to="b@x")  # another argument at the same position
        ctx.wait("go")
        return "v2"

    old = Agent("drift", v1, "1")
    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, old]), lease_seconds=30) as rt:
        job_id = rt.submit(old, {}).job_id
        assert rt.run_job(job_id).status == "waiting"
    rt.close()
    new = Agent("drift", v2, "1")  # same version: the code changed without saying so
    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, new]), lease_seconds=30) as rt:
        rt.signal(job_id, "go", {})
        assert rt.run_job(job_id).status == "parked"
        events = assert_log_sound(rt.store, job_id)
        [parked] = of_type(events, "job_parked")
        assert parked["reason"] == "nondeterministic" and parked["node_id"] == "#0"
        assert parked["detail"]["seq"] == 0
        assert parked["detail"]["recorded"]["args_hash"] != parked["detail"]["called"]["args_hash"]
        assert at.CALLS["email"] == 1
        failed = rt.resume(job_id, "fail", by="tester")
        assert failed.status == "failed"


def test_a_worker_with_another_version_does_not_run_the_job(store_url: str) -> None:
    def fn(ctx: AgentContext) -> Any:
        return ctx.call(at.send_email, to="v@x")

    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, Agent("ver", fn, "1")])) as rt:
        job_id = rt.submit("ver", {}).job_id
    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, Agent("ver", fn, "2")])) as rt:
        with pytest.raises(PlanError, match=r"version '1'.*this worker has version '2'"):
            rt.run_job(job_id)
        assert rt.get_job(job_id).lease_owner is None  # handed back at once
        assert len(rt.store.list_events(job_id)) == 2  # nothing written
    with (
        Runtime(store_url, tools=ToolRegistry(at.TOOLS)) as rt,
        pytest.raises(PlanError, match="agent 'ver'"),
    ):
        rt.run_job(job_id)
    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, Agent("ver", fn, "1")])) as rt:
        assert rt.run_job(job_id).status == "completed"


def test_patched_keeps_old_jobs_on_the_old_path(store_url: str) -> None:
    at.CALLS.clear()

    def old_code(ctx: AgentContext) -> Any:
        ctx.call(at.send_email, to="first@x")
        ctx.wait("go")
        return "old"

    def new_code(ctx: AgentContext) -> Any:
        if ctx.patched("add-lookup"):
            ctx.call(at.lookup_order, order_id="P-1")
        ctx.call(at.send_email, to="first@x")
        ctx.wait("go")
        return "patched" if ctx.patched("tail") else "unpatched"

    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, Agent("p", old_code, "1")])) as rt:
        old_job = rt.submit("p", {}).job_id
        assert rt.run_job(old_job).status == "waiting"
    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, Agent("p", new_code, "1")])) as rt:
        new_job = rt.submit("p", {}).job_id
        assert rt.run_job(new_job).status == "waiting"
        for job_id in (old_job, new_job):
            rt.signal(job_id, "go", {})
            assert rt.run_job(job_id).status == "completed", rt.get_job(job_id).error
        assert rt.get_job(old_job).output == "patched"  # new ground after the recorded part
        assert rt.get_job(new_job).output == "patched"
        old_kinds = [c["kind"] for c in calls(rt.store.list_events(old_job))]
        new_kinds = [c["kind"] for c in calls(rt.store.list_events(new_job))]
        assert old_kinds == ["tool", "wait", "patched"]
        assert new_kinds == ["patched", "tool", "tool", "wait", "patched"]
        assert at.CALLS["lookup"] == 1  # only the new job took the new path
        for job_id in (old_job, new_job):
            assert_log_sound(rt.store, job_id)


def test_bad_submissions_write_nothing(rt: Runtime) -> None:
    with pytest.raises(PlanError, match="agent 'ghost' is not registered"):
        submit_agent_job(rt.store, "ghost", {}, tools=rt.tools)
    with pytest.raises(PlanError, match="does not fit"):
        rt.submit("refund_agent", {"order": "x"})
    with pytest.raises(PlanError, match="JSON object"):
        rt.submit("refund_agent", [1, 2])
    assert rt.store.list_jobs() == []


def test_crash_loop_and_cancel_apply_to_agent_jobs(rt: Runtime) -> None:
    job = rt.submit("wait_agent", {})
    assert rt.run_job(job.job_id).status == "waiting"
    cancelled = rt.cancel(job.job_id, reason="no longer needed", by="tester")
    assert cancelled.status == "cancelled"
    assert_log_sound(rt.store, job.job_id)
    # a run that dies with the lease (simulated: claim, never run) is recovered
    job2 = rt.submit("refund_agent", {"order_id": "A-9"})
    rt.worker.lease_seconds = 0.2
    assert rt.worker.claim(job2.job_id) is not None
    wait_lease_expired(rt.store, job2.job_id)
    rt.worker.lease_seconds = 30
    assert rt.run_until_idle() == 1
    assert rt.get_job(job2.job_id).status == "completed"


def test_a_run_fenced_off_ends_even_if_the_agent_catches_everything(
    rt: Runtime, store_url: str
) -> None:
    job = rt.submit("stubborn_agent", {"db": store_url})
    assert rt.worker.run_once(job.job_id) == "lost"
    assert rt.get_job(job.job_id).status == "cancelled"
    assert "decide" not in at.CALLS  # the agent did not go on after its record was refused
    assert_log_sound(rt.store, job.job_id)


def test_nondeterministic_park_resumed_with_retry_after_the_fix(store_url: str) -> None:
    at.CALLS.clear()

    def v1(ctx: AgentContext) -> Any:
        ctx.call(at.send_email, to="a@x")
        ctx.wait("go")
        return "v1"

    def bad(ctx: AgentContext) -> Any:
        ctx.call(at.lookup_order, order_id="Z")  # another tool at call 0
        ctx.wait("go")
        return "bad"

    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, Agent("fix", v1, "1")])) as rt:
        job_id = rt.submit("fix", {}).job_id
        assert rt.run_job(job_id).status == "waiting"
        rt.signal(job_id, "go", {})
    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, Agent("fix", bad, "1")])) as rt:
        assert rt.run_job(job_id).status == "parked"
        parked = of_type(rt.store.list_events(job_id), "job_parked")[-1]
        assert parked["detail"]["called"]["tool_name"] == "ag_lookup_order"
        assert parked["detail"]["recorded"]["tool_name"] == "ag_send_email"
        rt.resume(job_id, "retry", by="tester")
    with Runtime(store_url, tools=ToolRegistry([*at.TOOLS, Agent("fix", v1, "1")])) as rt:
        done = rt.run_job(job_id)
        assert done.status == "completed" and done.output == "v1"
        assert at.CALLS == {"email": 1}  # the recorded call was not made again
        assert_log_sound(rt.store, job_id)


def test_async_agent_waits_recovers_and_fails_like_a_sync_one(rt: Runtime) -> None:
    ok = rt.submit("async_wait_agent", {}).job_id
    bad = rt.submit("async_wait_agent", {"fail": True}).job_id
    for job_id in (ok, bad):
        assert rt.run_job(job_id).status == "waiting"
        rt.signal(job_id, "async-go", {"n": 1})
    done = rt.run_job(ok)
    assert done.status == "completed" and done.output == {
        "first": "async-before@x",
        "got": {"n": 1},
    }
    failed = rt.run_job(bad)
    assert failed.status == "failed" and failed.error["message"] == "card declined"
    # each job's first call ran once; the concurrent call next to the failing one recorded
    # its outcome before the job failed
    assert at.CALLS == {"email": 3, "decline": 1}
    for job_id in (ok, bad):
        assert_log_sound(rt.store, job_id)
    events = rt.store.list_events(bad)
    assert [c["kind"] for c in calls(events)] == ["tool", "wait", "tool", "tool"]


_SEEN: list[tuple[str, bool]] = []


@affidavit.agent("ag_current_sync", version="1")
def _current_plain(ctx: AgentContext) -> str:
    _SEEN.append(("sync", AgentContext.current() is ctx))
    return ctx.job_id


@affidavit.agent("ag_current_async", version="1")
async def _current_coroutine(ctx: AgentContext) -> str:
    async def task() -> bool:
        return AgentContext.current() is ctx

    _SEEN.append(("async", AgentContext.current() is ctx))
    _SEEN.append(("task", await asyncio.create_task(task())))
    return ctx.job_id


def test_the_current_context_is_the_running_jobs(store_url: str) -> None:
    """``AgentContext.current()`` (what framework adapters record with) is the job's context
    inside its function — in a plain ``def`` agent, in an ``async def`` one and in the tasks it
    starts — and ``None`` outside any job."""
    _SEEN.clear()
    assert AgentContext.current() is None
    with Runtime(store_url, tools=ToolRegistry([_current_plain, _current_coroutine])) as rt:
        for fn in (_current_plain, _current_coroutine):
            job = rt.submit(fn, {})
            assert rt.run_job(job.job_id).output == job.job_id
    assert _SEEN == [("sync", True), ("async", True), ("task", True)]
    assert AgentContext.current() is None
