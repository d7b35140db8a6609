"""Tools for the reliability tests, imported by the test process and by the driver subprocesses.

Every real execution appends one JSON line to a side-channel file whose path travels in the
tool's args (``side``), so a test counts what really happened in the world independently of the
database. Lines are written with a single ``os.write`` on an ``O_APPEND`` descriptor: a process
killed with SIGKILL right after the call still leaves its line (it is in the kernel), and
concurrent writers from several processes never interleave.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from affidavit import (
    AgentContext,
    CompensatableError,
    RetryableError,
    ToolContext,
    ToolRegistry,
    agent,
    pure,
    tool,
)


def record(side: str, **fields: Any) -> None:
    """Append one line describing a real execution to the side channel ``side``."""
    line = (json.dumps({**fields, "pid": os.getpid()}, sort_keys=True) + "\n").encode()
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_side(side: str | Path) -> list[dict[str, Any]]:
    """Every complete line of the side channel (a missing file is an empty channel)."""
    try:
        text = Path(side).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = []
    for raw in text.splitlines(keepends=True):
        if raw.endswith("\n"):  # a line still being written by another process is skipped
            lines.append(json.loads(raw))
    return lines


def counts(side: str | Path, kind: str) -> Counter[tuple[str, str]]:
    """How many real executions of ``kind`` each (job id, node id) had."""
    return Counter((line["job"], line["node"]) for line in read_side(side) if line["kind"] == kind)


def _charge(ctx: ToolContext, side: str, amount: int) -> dict[str, Any]:
    record(side, kind="charge", job=ctx.job_id, node=ctx.node_id, key=ctx.external_key)
    if os.environ.get("AFFIDAVIT_TEST_KILL_IN_TOOL") == "1":  # dies inside the tool, after acting
        os.kill(os.getpid(), signal.SIGKILL)
    return {"charge_id": ctx.external_key, "amount": amount}


@tool("crash_charge")
def charge(ctx: ToolContext, side: str, amount: int) -> dict[str, Any]:
    """A payment: the effect is the side-channel line, identified by the external key."""
    return _charge(ctx, side, amount)


@charge.reconcile
def _charge_reconcile(ctx: ToolContext, side: str, amount: int) -> dict[str, Any] | None:
    """Did the charge with this (dead attempt's) external key happen? Ask the "payment API"."""
    for line in read_side(side):
        if line["kind"] == "charge" and line["key"] == ctx.external_key:
            return {"charge_id": line["key"], "amount": amount}
    return None


@tool("crash_charge_nr")
def charge_no_reconcile(ctx: ToolContext, side: str, amount: int) -> dict[str, Any]:
    """The same payment, without a reconcile hook: an in-flight call cannot be looked up."""
    return _charge(ctx, side, amount)


@tool("crash_slow_charge")
def slow_charge(ctx: ToolContext, side: str, amount: int, delay: float) -> dict[str, Any]:
    """A charge whose call returns ``delay`` seconds after the effect: the window in which a
    test freezes the worker process (SIGSTOP)."""
    result = _charge(ctx, side, amount)
    time.sleep(delay)
    return result


@slow_charge.reconcile
def _slow_charge_reconcile(
    ctx: ToolContext, side: str, amount: int, delay: float
) -> dict[str, Any] | None:
    return _charge_reconcile(ctx, side, amount)


@tool("crash_slow_charge_nr")
def slow_charge_no_reconcile(
    ctx: ToolContext, side: str, amount: int, delay: float
) -> dict[str, Any]:
    """The slow charge without a reconcile hook."""
    result = _charge(ctx, side, amount)
    time.sleep(delay)
    return result


@tool("crash_decline")
def decline(ctx: ToolContext, side: str) -> dict[str, Any]:
    """A call the world refuses for good (a permanent failure)."""
    record(side, kind="decline", job=ctx.job_id, node=ctx.node_id, key=ctx.external_key)
    raise ValueError("card declined")


@tool("crash_busy")
def busy(ctx: ToolContext, side: str) -> dict[str, Any]:
    """A call that always asks to be retried (a retryable failure)."""
    record(side, kind="busy", job=ctx.job_id, node=ctx.node_id, key=ctx.external_key)
    raise RetryableError("try again later")


@tool("crash_book")
def book(ctx: ToolContext, side: str) -> dict[str, Any]:
    """A booking that half happens and fails as compensatable; its compensation releases it.
    With ``AFFIDAVIT_TEST_KILL_IN_COMPENSATION=1`` the process kills itself (SIGKILL) inside the
    compensation, after recording it."""
    record(side, kind="book", job=ctx.job_id, node=ctx.node_id, key=ctx.external_key)
    raise CompensatableError("half booked")


@book.compensate
def _release(ctx: ToolContext, side: str) -> dict[str, Any]:
    record(side, kind="release", job=ctx.job_id, node=ctx.node_id, key=ctx.external_key)
    if os.environ.get("AFFIDAVIT_TEST_KILL_IN_COMPENSATION") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"released": True}


@pure("crash_compute")
def compute(ctx: ToolContext, side: str, charged: dict[str, Any]) -> dict[str, Any]:
    """A pure step (think: an LLM call). Its calls are counted too."""
    record(side, kind="compute", job=ctx.job_id, node=ctx.node_id, key=ctx.external_key)
    return {"amount": charged["amount"] + 1, "from": charged["charge_id"]}


# What crash_tally returns: one object per process, kept and changed by every call.
_TALLY: dict[str, Any] = {"calls": 0}


@pure("crash_tally")
def tally(ctx: ToolContext, side: str) -> dict[str, Any]:
    """A pure step that returns an object it keeps and changes on its next call (think: a
    memoized lookup enriched in place). Its recorded output is what it returned then."""
    record(side, kind="tally", job=ctx.job_id, node=ctx.node_id, key=ctx.external_key)
    _TALLY["calls"] += 1
    return _TALLY


def _crash_agent(
    ctx: AgentContext,
    side: str,
    amount: int,
    tool_name: str = "crash_charge",
    wait: bool = False,
    sleep: float | None = None,
) -> dict[str, Any]:
    """The charge plan as an agent: charge → [wait | sleep] → compute → charge."""
    charged = ctx.call(tool_name, side=side, amount=amount)
    if wait:
        ctx.wait("go")
    if sleep is not None:
        ctx.sleep(sleep)
    computed = ctx.call(compute, side=side, charged=charged)
    return {"charge2": ctx.call(tool_name, side=side, amount=computed["amount"])}


crash_agent = agent("crash_agent", version="1", retry={"max_attempts": 3, "backoff_seconds": 0})(
    _crash_agent
)
crash_agent_fail = agent(
    "crash_agent_fail",
    version="1",
    in_flight="fail",
    retry={"max_attempts": 3, "backoff_seconds": 0},
)(_crash_agent)


@pure("crash_think")
def think(ctx: ToolContext, side: str, n: int) -> dict[str, Any]:
    """A pure step that streams ``n`` tokens as it runs (think: a model request)."""
    record(side, kind="think", job=ctx.job_id, node=ctx.node_id, key=ctx.external_key)
    for i in range(n):
        ctx.emit({"token": i})
    return {"thought": n}


@agent("crash_stream_agent", version="1", retry={"max_attempts": 3, "backoff_seconds": 0})
def stream_agent(ctx: AgentContext, side: str, amount: int) -> dict[str, Any]:
    """Emits around a charge and a streaming pure step: start, charged, (tokens), done."""
    ctx.emit("start")
    charged = ctx.call("crash_charge", side=side, amount=amount)
    ctx.emit({"charged": charged["amount"]})
    ctx.call(think, side=side, n=2)
    ctx.emit("done")
    return {"ok": True}


@agent("crash_parent", version="1")
def crash_parent(ctx: AgentContext, side: str, children: int = 2) -> dict[str, Any]:
    """Starts ``children`` charge agents as child jobs and joins them."""
    started = [
        ctx.start_job("crash_agent", {"side": side, "amount": 10 + i}) for i in range(children)
    ]
    return {"children": [r.to_dict() for r in ctx.join_all(started)]}


@agent("crash_batch_parent", version="1")
def crash_batch_parent(ctx: AgentContext, side: str, children: int = 3) -> dict[str, Any]:
    """Starts ``children`` charge agents as one batch (``ctx.start_jobs``) and joins them."""
    started = ctx.start_jobs(
        "crash_agent", [{"side": side, "amount": 10 + i} for i in range(children)]
    )
    return {"children": [r.to_dict() for r in ctx.join_all(started)]}


REGISTRY = ToolRegistry(
    [
        stream_agent,
        crash_batch_parent,
        think,
        crash_parent,
        crash_agent,
        crash_agent_fail,
        charge,
        charge_no_reconcile,
        slow_charge,
        slow_charge_no_reconcile,
        decline,
        busy,
        book,
        compute,
        tally,
    ]
)


def charge_plan(tool_name: str = "crash_charge", in_flight: str | None = None) -> dict[str, Any]:
    """tool → pure → tool: charge1 → compute → charge2."""
    plan: dict[str, Any] = {
        "name": "crash-matrix",
        "retry": {"max_attempts": 3, "backoff_seconds": 0},
        "nodes": [
            {
                "id": "charge1",
                "type": "tool",
                "tool": tool_name,
                "args": {"side": "${input.side}", "amount": "${input.amount}"},
            },
            {
                "id": "compute",
                "type": "pure",
                "tool": "crash_compute",
                "args": {"side": "${input.side}", "charged": "${charge1}"},
                "depends_on": ["charge1"],
            },
            {
                "id": "charge2",
                "type": "tool",
                "tool": tool_name,
                "args": {"side": "${input.side}", "amount": "${compute.amount}"},
                "depends_on": ["compute"],
            },
        ],
    }
    if in_flight is not None:
        plan["in_flight"] = in_flight
    return plan


def three_tools_plan() -> dict[str, Any]:
    """Three tool steps in a row (the multi-worker load): s1 → s2 → s3, each a charge."""
    nodes: list[dict[str, Any]] = []
    for i in (1, 2, 3):
        node: dict[str, Any] = {
            "id": f"s{i}",
            "type": "tool",
            "tool": "crash_charge",
            "args": {"side": "${input.side}", "amount": "${input.n}"},
        }
        if i > 1:
            node["depends_on"] = [f"s{i - 1}"]
        nodes.append(node)
    return {
        "name": "three-steps",
        "retry": {"max_attempts": 3, "backoff_seconds": 0},
        "nodes": nodes,
    }
