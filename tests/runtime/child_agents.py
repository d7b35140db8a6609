"""Agents for the child-job tests: a parent that delegates refunds to child agents, and children
that complete, fail or wait. Every real tool execution is counted in :data:`CALLS`."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from affidavit import AgentContext, ToolContext, ToolRegistry, agent, tool

CALLS: Counter[str] = Counter()


@tool("ch_refund")
def refund(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    CALLS[order_id] += 1
    return {"refunded": order_id}


@agent("ch_refund_agent", version="1")
def refund_agent(ctx: AgentContext, order_id: str) -> dict[str, Any]:
    if order_id.startswith("BAD"):
        raise RuntimeError(f"cannot refund {order_id}")
    if order_id.startswith("WAIT"):
        ctx.wait(f"go-{order_id}")
    return dict(ctx.call(refund, order_id=order_id))


@agent("ch_parent", version="1")
def parent(ctx: AgentContext, orders: list[str]) -> list[dict[str, Any]]:
    handles = [ctx.start_job(refund_agent, {"order_id": o}) for o in orders]
    return [r.to_dict() for r in ctx.join_all(handles)]


@agent("ch_batch", version="1")
def batch(ctx: AgentContext, orders: list[str]) -> list[dict[str, Any]]:
    handles = ctx.start_jobs(refund_agent, [{"order_id": o} for o in orders])
    return [r.to_dict() for r in ctx.join_all(handles)]


def _parent_batched(ctx: AgentContext, orders: list[str]) -> list[dict[str, Any]]:
    handles = ctx.start_jobs("ch_refund_agent", [{"order_id": o} for o in orders])
    return [r.to_dict() for r in ctx.join_all(handles)]


#: :data:`parent` as a batch: the same name, version and steps (not in :func:`registry`).
parent_batched = replace(parent, fn=_parent_batched)


@agent("ch_bad_batch", version="1")
def bad_batch(ctx: AgentContext, n: int) -> list[str]:
    refused = []
    for inputs in ([], [{"order_id": str(i)} for i in range(n)], [{"order_id": "A"}, {"x": 1}]):
        try:
            ctx.start_jobs(refund_agent, inputs)
        except ValueError as exc:
            refused.append(str(exc))
    return refused


#: The meeting :func:`meet` waits at (set by the test; its parties run at the same time).
MEETING: list[threading.Barrier] = []


@tool("ch_meet")
def meet(ctx: ToolContext, n: int) -> int:
    MEETING[0].wait(timeout=5)  # (broken, the call fails: they did not all run at once)
    return n


@agent("ch_meeting_child", version="1")
def meeting_child(ctx: AgentContext, n: int) -> int:
    return int(ctx.call(meet, n=n))


@agent("ch_meeting", version="1")
def meeting(ctx: AgentContext, n: int) -> list[str]:
    return [
        r.status for r in ctx.join_all(ctx.start_jobs(meeting_child, [{"n": i} for i in range(n)]))
    ]


@agent("ch_meeting_parent", version="1")
def meeting_parent(ctx: AgentContext, n: int) -> list[str]:
    """Starts ``n`` children, then meets them (its run goes on while they run)."""
    handles = ctx.start_jobs(meeting_child, [{"n": i} for i in range(n)])
    ctx.call(meet, n=n)
    return [r.status for r in ctx.join_all(handles)]


@agent("ch_one", version="1")
def one(ctx: AgentContext, order_id: str) -> dict[str, Any]:
    result = ctx.run_job("ch_refund_agent", {"order_id": order_id})
    return {"status": result.status, "output": result.output}


@agent("ch_async_parent", version="1")
async def async_parent(ctx: AgentContext, orders: list[str]) -> list[dict[str, Any]]:
    handles = [await ctx.start_job(refund_agent, {"order_id": o}) for o in orders]
    first = await ctx.join(handles[0])
    rest = await ctx.join_all(handles[1:])
    return [first.to_dict(), *[r.to_dict() for r in rest]]


@agent("ch_bad_join", version="1")
def bad_join(ctx: AgentContext) -> None:
    ctx.join("not a handle")


@agent("ch_bad_start", version="1")
def bad_start(ctx: AgentContext) -> list[str]:
    refused = []
    for target, job_input, queue in [
        ("ghost_agent", {}, None),
        (refund_agent, {"nope": 1}, None),
        (refund_agent, {"order_id": "Q"}, "no-such-queue"),
    ]:
        try:
            ctx.start_job(target, job_input, queue=queue)
        except ValueError as exc:
            refused.append(str(exc))
    return refused


@agent("ch_forget", version="1")
def forget(ctx: AgentContext, orders: list[str]) -> list[str]:
    """Starts a child per order and never joins them."""
    return [ctx.start_job(refund_agent, {"order_id": o}).job_id for o in orders]


@tool("ch_hang")
def hang(ctx: ToolContext, seconds: float) -> dict[str, Any]:
    """A call that answers late (past the time limit its caller gives it)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not ctx.cancelled:
        time.sleep(0.02)
    return {"late": True}


@agent("ch_parent_then", version="1")
def parent_then(ctx: AgentContext, order_id: str) -> dict[str, Any]:
    """Starts a child, waits for a signal, then fails or parks (a call past its timeout has
    an unknown outcome: the job parks) as the signal says."""
    ctx.start_job(refund_agent, {"order_id": order_id})
    then = ctx.wait("then")
    if then == "fail":
        raise RuntimeError("the parent gives up")
    ctx.call(hang, timeout_seconds=0.2, seconds=2.0)
    return {}


def registry() -> ToolRegistry:
    return ToolRegistry(
        [refund, refund_agent, parent, one, async_parent, bad_join, bad_start, forget, hang,
         parent_then, batch, bad_batch, meet, meeting_child, meeting, meeting_parent]
    )  # fmt: skip
