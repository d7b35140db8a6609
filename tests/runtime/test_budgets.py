"""Budgets of agent jobs (``@agent(..., budget=Budget(...))``) on SQLite and PostgreSQL: the
call that would exceed the budget does not run, the job parks as ``budget_exceeded`` showing
what it spent, ``resume --decision continue --budget`` sets a new (absolute) budget, ``fail``
ends the job; usage reported by tools is recorded and counted."""

from __future__ import annotations

from collections import Counter

import pytest

from affidavit import Budget, Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.errors import ConfigError
from affidavit.runtime._agent import Agent, AgentContext
from affidavit.runtime._decisions import InvalidStateError
from affidavit.verify import verify_job
from tests.runtime.helpers import assert_log_sound, of_type

RAN: Counter[str] = Counter()


def act(ctx: ToolContext, n: int) -> int:
    RAN["act"] += 1
    return n


def think(ctx: ToolContext, n: int) -> int:
    RAN["think"] += 1
    ctx.report_usage(tokens=400, cost=0.25)
    return n


TOOLS = [Tool("act", act, "tool"), Tool("think", think, "pure")]


def loop(ctx: AgentContext, steps: int) -> int:
    total = 0
    for i in range(steps):
        total += ctx.call("think", n=i)
        total += ctx.call("act", n=i)
    return total


def runtime(url: str, budget: Budget) -> Runtime:
    return Runtime(url, tools=ToolRegistry([*TOOLS, Agent("looper", loop, "1", budget=budget)]))


def test_the_call_past_the_tool_call_budget_does_not_run(store_url: str) -> None:
    RAN.clear()
    with runtime(store_url, Budget(tool_calls=5)) as rt:
        job_id = rt.submit("looper", {"steps": 10}).job_id
        assert rt.run_job(job_id).status == "parked"
        assert RAN == {"think": 3, "act": 2}  # five calls, the sixth never ran
        events = assert_log_sound(rt.store, job_id)
        assert len(of_type(events, "step_called")) == 5
        [parked] = of_type(events, "job_parked")
        assert parked["reason"] == "budget_exceeded"
        assert parked["detail"]["spent"] == {"tool_calls": 5, "model_tokens": 1200, "cost": 0.75}
        assert parked["detail"]["budget"] == {"tool_calls": 5}
        assert parked["detail"]["call"] == {"kind": "tool", "tool_name": "act"}
        assert verify_job(rt.store, job_id).ok
        # continue with a new budget (absolute: 20 calls in all, not 20 more)
        with pytest.raises(InvalidStateError, match="needs its new budget"):
            rt.resume(job_id, "continue")
        rt.resume(job_id, "continue", budget={"tool_calls": 20})
        assert rt.run_job(job_id).status == "completed"
        assert RAN == {"think": 10, "act": 10}
        assert rt.get_job(job_id).output == 2 * sum(range(10))
        assert verify_job(rt.store, job_id).ok


def test_model_tokens_and_cost_stop_the_next_call(store_url: str) -> None:
    RAN.clear()
    with runtime(store_url, Budget(model_tokens=1000)) as rt:
        job_id = rt.submit("looper", {"steps": 10}).job_id
        assert rt.run_job(job_id).status == "parked"
        # 3 thinks spend 1200 ≥ 1000: the call after the third think does not run
        assert RAN == {"think": 3, "act": 2}
        events = assert_log_sound(rt.store, job_id)
        usage = [p["usage"] for p in of_type(events, "node_finished") if "usage" in p]
        assert usage == [{"tokens": 400, "cost": 0.25}] * 3
        done = rt.resume(job_id, "fail", by="tester")
        assert done.status == "failed"
        assert verify_job(rt.store, job_id).ok
    RAN.clear()
    with runtime(store_url, Budget(cost=0.5)) as rt:
        job_id = rt.submit("looper", {"steps": 10}).job_id
        assert rt.run_job(job_id).status == "parked"
        assert RAN == {"think": 2, "act": 1}


def test_budgets_and_usage_are_checked_where_they_are_written() -> None:
    with pytest.raises(ConfigError):
        Budget()
    with pytest.raises(ConfigError):
        Budget(tool_calls=-1)
    with pytest.raises(ConfigError):
        Budget(cost=float("nan"))
    with pytest.raises(ConfigError):
        Budget.from_dict({"calls": 3})
    assert Budget.from_dict({"tool_calls": 3}) == Budget(tool_calls=3)
    ctx = ToolContext("j", "n", "s", 1, None, "k")
    with pytest.raises(Exception, match="tokens"):
        ctx.report_usage(tokens=-5)
    ctx.report_usage(tokens=3, cost=1)
    ctx.report_usage(tokens=2)
    assert ctx.usage == {"tokens": 5, "cost": 1.0}
