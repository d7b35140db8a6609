"""The limit invariant, offline: a log whose limited calls broke the limit their grants record
(more started in a window than the rate, more in flight than the concurrency) fails
verification, even with its chain recomputed; the log the runtime wrote passes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from affidavit import Limit, Runtime, Tool, ToolContext, ToolRegistry
from affidavit.verify import verify_job
from affidavit.verify.verification import verify_event_rows
from tests.runtime.helpers import node, plan
from tests.verify.helpers import rows


def chat(ctx: ToolContext) -> str:
    time.sleep(0.01)
    return ctx.node_id


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    t = Tool("chat", chat, "tool", limit=Limit(rate="5/1m", concurrency=1))
    with Runtime(store_url, tools=ToolRegistry([t]), step_concurrency=3) as runtime:
        yield runtime


def limited_log(rt: Runtime) -> tuple[str, list[dict[str, Any]]]:
    job_id = rt.submit(plan(*(node(f"n{i}", "chat") for i in range(3))), {}).job_id
    assert rt.run_job(job_id).status == "completed"
    verified = verify_job(rt.store, job_id)
    assert verified.ok, [c for c in verified.checks() if not c.ok]
    return job_id, [{"type": e.type, "payload": e.payload} for e in rt.store.list_events(job_id)]


def grants(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        e["payload"]["limit_grant"]
        for e in log
        if e["type"] == "tool_invocation_started" and "limit_grant" in e["payload"]
    ]


def replay_of(job_id: str, log: list[dict[str, Any]]) -> Any:
    return verify_event_rows(job_id, rows(log), status="completed").replay_proof_result


def test_the_runtimes_log_records_every_grant_and_passes(rt: Runtime) -> None:
    job_id, log = limited_log(rt)
    recorded = grants(log)
    assert len(recorded) == 3
    assert {(g["limit"], tuple(g["rate"]), g["concurrency"]) for g in recorded} == {
        ("chat", (5, 60_000_000), 1)
    }
    assert replay_of(job_id, log).ok


def test_more_starts_in_a_window_than_the_rate_fails(rt: Runtime) -> None:
    job_id, log = limited_log(rt)
    for g in grants(log):
        g["rate"] = [2, 60_000_000]  # three calls within a minute
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "limit", replay.error
    assert "3 calls started" in replay.error


def test_more_in_flight_than_the_concurrency_fails(rt: Runtime) -> None:
    job_id, log = limited_log(rt)
    first, second, _ = grants(log)
    second["granted_at"] = first["granted_at"]  # the second began before the first ended
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "limit", replay.error
    assert "2 calls in flight" in replay.error


def test_a_grant_before_an_earlier_one_fails(rt: Runtime) -> None:
    job_id, log = limited_log(rt)
    third = grants(log)[2]
    third["granted_at"], third["concurrency"] = "2000-01-01T00:00:00.000000Z", 3
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "limit", replay.error


def test_a_malformed_grant_fails(rt: Runtime) -> None:
    job_id, log = limited_log(rt)
    grants(log)[0]["granted_at"] = "yesterday"
    replay = replay_of(job_id, log)
    assert not replay.ok


def test_a_call_past_the_recorded_budget_fails(store_url: str) -> None:
    from affidavit import Budget
    from affidavit.runtime._agent import Agent, AgentContext

    def loop(ctx: AgentContext) -> int:
        return sum(ctx.call("chat") == "x" for _ in range(3))

    agent = Agent("looper", loop, "1", budget=Budget(tool_calls=3))
    with Runtime(store_url, tools=ToolRegistry([Tool("chat", chat, "pure"), agent])) as rt:
        job_id = rt.submit("looper", {}).job_id
        assert rt.run_job(job_id).status == "completed"
        log = [{"type": e.type, "payload": e.payload} for e in rt.store.list_events(job_id)]
    assert replay_of(job_id, log).ok
    for e in log:  # the budget recorded said two calls
        if e["type"] == "agent_started":
            e["payload"]["budget"] = {"tool_calls": 2}
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "budget", replay.error
    assert "ran past the job's budget" in replay.error


# --- limited pure steps (a model request with a model limit among them) --------------------


@pytest.fixture
def pure_rt(store_url: str) -> Iterator[Runtime]:
    t = Tool("llm", chat, "pure", limit=Limit(rate="5/1m", concurrency=1))
    with Runtime(store_url, tools=ToolRegistry([t]), step_concurrency=3) as runtime:
        yield runtime


def step_grants(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        e["payload"] for e in log if e["type"] == "node_finished" and "limit_grant" in e["payload"]
    ]


def limited_steps_log(rt: Runtime) -> tuple[str, list[dict[str, Any]]]:
    job_id = rt.submit(plan(*(node(f"n{i}", "llm", "pure") for i in range(3))), {}).job_id
    assert rt.run_job(job_id).status == "completed"
    verified = verify_job(rt.store, job_id)
    assert verified.ok, [c for c in verified.checks() if not c.ok]
    log = [{"type": e.type, "payload": e.payload} for e in rt.store.list_events(job_id)]
    assert len(step_grants(log)) == 3
    return job_id, log


def test_a_limited_pure_steps_log_passes(pure_rt: Runtime) -> None:
    job_id, log = limited_steps_log(pure_rt)
    assert replay_of(job_id, log).ok


def test_more_pure_steps_in_a_window_than_the_rate_fails(pure_rt: Runtime) -> None:
    job_id, log = limited_steps_log(pure_rt)
    for finished in step_grants(log):
        finished["limit_grant"]["rate"] = [2, 60_000_000]
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "limit", replay.error
    assert "3 calls started" in replay.error


def test_pure_steps_overlapping_past_the_concurrency_fail(pure_rt: Runtime) -> None:
    job_id, log = limited_steps_log(pure_rt)
    first, second, _ = step_grants(log)
    second["limit_grant"]["granted_at"] = first["limit_grant"]["granted_at"]
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "limit", replay.error
    assert "2 calls in flight" in replay.error


def test_a_pure_step_finished_before_its_grant_fails(pure_rt: Runtime) -> None:
    job_id, log = limited_steps_log(pure_rt)
    step_grants(log)[1]["limit_grant"]["granted_at"] = "2999-01-01T00:00:00.000000Z"
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "limit", replay.error
    assert "finished before its grant" in replay.error


def test_one_grant_recorded_for_two_steps_fails(pure_rt: Runtime) -> None:
    job_id, log = limited_steps_log(pure_rt)
    first, second, _ = step_grants(log)
    second["limit_grant"]["grant_id"] = first["limit_grant"]["grant_id"]
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "limit", replay.error


def test_an_agents_limited_pure_steps_are_checked(store_url: str) -> None:
    from affidavit.runtime._agent import Agent, AgentContext

    def loop(ctx: AgentContext) -> int:
        return sum(ctx.call("llm") == "x" for _ in range(3))

    tools = [Tool("llm", chat, "pure", limit=Limit(rate="5/1m")), Agent("asker", loop, "1")]
    with Runtime(store_url, tools=ToolRegistry(tools)) as rt:
        job_id = rt.submit("asker", {}).job_id
        assert rt.run_job(job_id).status == "completed"
        log = [{"type": e.type, "payload": e.payload} for e in rt.store.list_events(job_id)]
    assert len(step_grants(log)) == 3 and replay_of(job_id, log).ok
    for finished in step_grants(log):
        finished["limit_grant"]["rate"] = [1, 60_000_000]
    replay = replay_of(job_id, log)
    assert not replay.ok and replay.invariant == "limit", replay.error
