"""Agents (and their tools) for the agent-job tests: a refund agent whose decisions come from a
scripted pure function, and agents that exercise each ``ctx`` call. Every real tool execution is
counted in :data:`CALLS` (in-process tests) — the crash tests use crash_tools' side channel."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

from affidavit import AgentContext, ToolContext, ToolRegistry, agent, pure, tool

CALLS: Counter[str] = Counter()


@tool("ag_lookup_order")
def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    CALLS["lookup"] += 1
    return {"order_id": order_id, "total": 250 if order_id.startswith("BIG") else 40}


@pure("ag_decide_refund")
def decide_refund(ctx: ToolContext, order: dict[str, Any]) -> dict[str, Any]:
    CALLS["decide"] += 1
    return {"amount": order["total"], "reason": "damaged"}


@tool("ag_issue_refund")
def issue_refund(ctx: ToolContext, order_id: str, amount: int) -> dict[str, Any]:
    CALLS["refund"] += 1
    return {"refund_id": ctx.external_key, "amount": amount}


@tool("ag_send_email")
def send_email(ctx: ToolContext, to: str) -> dict[str, Any]:
    CALLS["email"] += 1
    return {"sent": to}


@tool("ag_flaky")
def flaky(ctx: ToolContext, n: int) -> dict[str, Any]:
    CALLS["flaky"] += 1
    if ctx.attempt < 2:
        from affidavit import RetryableError

        raise RetryableError("busy")
    return {"n": n, "attempt": ctx.attempt}


@pure("ag_flaky_pure")
def flaky_pure(ctx: ToolContext, n: int) -> dict[str, Any]:
    CALLS["flaky_pure"] += 1
    if ctx.attempt < 2:
        from affidavit import RetryableError

        raise RetryableError("not yet")
    return {"n": n, "attempt": ctx.attempt}


@tool("ag_decline")
def decline(ctx: ToolContext) -> dict[str, Any]:
    CALLS["decline"] += 1
    raise ValueError("card declined")


@tool("ag_cancel_own_job")
def cancel_own_job(ctx: ToolContext, db: str) -> dict[str, Any]:
    """Cancels the job that calls it with --force (a person abandoning the call meanwhile): its
    record is fenced."""
    from affidavit.runtime._decisions import cancel_job
    from affidavit.store import open_store

    store = open_store(db)
    try:
        cancel_job(store, ctx.job_id, reason="cancelled while a tool ran", by="tester", force=True)
    finally:
        store.close()
    return {"cancelled": True}


@agent("stubborn_agent", version="1")
def stubborn_agent(ctx: AgentContext, db: str) -> Any:
    with contextlib.suppress(Exception):  # whatever this catches, the run does not go on
        ctx.call(cancel_own_job, db=db)
    ctx.call(decide_refund, order={"total": 1})  # a pure step would run before its write
    return "went on"


@agent("refund_agent", version="1", retry={"max_attempts": 3, "backoff_seconds": 0})
def refund_agent(ctx: AgentContext, order_id: str) -> dict[str, Any]:
    order = ctx.call(lookup_order, order_id=order_id)
    decision = ctx.call("ag_decide_refund", order=order)
    if decision["amount"] > 100:
        ctx.approval("big_refund", payload=decision)
    ctx.call(issue_refund, order_id=order_id, amount=decision["amount"])
    return {"refunded": decision["amount"]}


@agent("fanout_agent", version="1", max_concurrency=3)
def fanout_agent(ctx: AgentContext, n: int) -> list[Any]:
    handles = [ctx.start(send_email, to=f"u{i}@example.com") for i in range(n)]
    sent = ctx.gather(*handles)
    return [s["sent"] for s in sent]


@agent("async_agent", version="1", max_concurrency=2)
async def async_agent(ctx: AgentContext, n: int) -> dict[str, Any]:
    order = await ctx.call(lookup_order, order_id="A-1")
    sent = await asyncio.gather(*(ctx.call(send_email, to=f"a{i}@x") for i in range(n)))
    return {"order": order["order_id"], "sent": [s["sent"] for s in sent]}


@agent("async_wait_agent", version="1", retry={"max_attempts": 1, "backoff_seconds": 0})
async def async_wait_agent(ctx: AgentContext, fail: bool = False) -> Any:
    first = await ctx.call(send_email, to="async-before@x")
    got = await ctx.wait("async-go")
    if fail:
        await asyncio.gather(ctx.call(send_email, to="par@x"), ctx.call(decline))
    return {"first": first["sent"], "got": got}


@agent("values_agent", version="1")
def values_agent(ctx: AgentContext) -> dict[str, Any]:
    return {"now": ctx.now(), "uuid": ctx.uuid(), "random": ctx.random(), "job": ctx.job_id}


@agent("wait_agent", version="1")
def wait_agent(ctx: AgentContext, timeout: float | None = None) -> dict[str, Any]:
    ctx.call(send_email, to="before@x")
    got = ctx.wait("go", timeout_seconds=timeout)
    ctx.call(send_email, to="after@x")
    return {"got": got}


@agent("sleep_agent", version="1")
def sleep_agent(ctx: AgentContext, seconds: float) -> dict[str, Any]:
    ctx.call(send_email, to="before@x")
    ctx.sleep(seconds)
    ctx.call(send_email, to="after@x")
    return {"slept": seconds}


@agent("retry_agent", version="1", retry={"max_attempts": 3, "backoff_seconds": 0})
def retry_agent(ctx: AgentContext) -> Any:
    return ctx.call(flaky, n=7)


@agent("retry_pure_agent", version="1", retry={"max_attempts": 3, "backoff_seconds": 0})
def retry_pure_agent(ctx: AgentContext) -> Any:
    return ctx.call(flaky_pure, n=3)


@agent("failing_agent", version="1", retry={"max_attempts": 1, "backoff_seconds": 0})
def failing_agent(ctx: AgentContext) -> Any:
    try:
        ctx.call(decline)
    except Exception:  # an agent cannot swallow a step's failure
        return "swallowed"
    return "unreachable"


@agent("raising_agent", version="1")
def raising_agent(ctx: AgentContext) -> Any:
    ctx.call(send_email, to="x@x")
    raise RuntimeError("the agent's own bug")


TOOLS = [
    lookup_order,
    decide_refund,
    issue_refund,
    send_email,
    flaky,
    flaky_pure,
    decline,
    cancel_own_job,
]
AGENTS = [
    refund_agent,
    fanout_agent,
    async_agent,
    async_wait_agent,
    values_agent,
    wait_agent,
    sleep_agent,
    retry_agent,
    retry_pure_agent,
    failing_agent,
    raising_agent,
    stubborn_agent,
]


def registry() -> ToolRegistry:
    return ToolRegistry([*TOOLS, *AGENTS])
