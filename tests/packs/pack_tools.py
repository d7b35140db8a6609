"""Tools, plans and agents for the proof-pack scenarios (tests/packs/scenarios.py): one job of
each kind the runtime can finish — approvals, signals, sleeps, parks, cancels, retries,
compensations, failures. The crash scenarios use tests/runtime/crash_tools.py instead (its
registry is what the worker subprocess loads)."""

from __future__ import annotations

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
from affidavit.runtime._decisions import cancel_job
from affidavit.store import open_store

FAST_RETRY = {"max_attempts": 3, "backoff_seconds": 0}


@pure("pk_quote")
def quote(ctx: ToolContext, amount: int) -> dict[str, Any]:
    return {"amount": amount}


@tool("pk_pay")
def pay(ctx: ToolContext, amount: int, answer: Any = None) -> dict[str, Any]:
    return {"paid": amount, "key": ctx.external_key, "answer": answer}


@tool("pk_flaky")
def flaky(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """Busy on its first two tries, then done: two retryable failures and a success."""
    if ctx.attempt < 3:
        raise RetryableError(f"busy (try {ctx.attempt})")
    return {"paid": amount, "attempt": ctx.attempt}


@tool("pk_decline")
def decline(ctx: ToolContext) -> dict[str, Any]:
    raise ValueError("card declined")


@tool("pk_book")
def book(ctx: ToolContext, seats: int) -> dict[str, Any]:
    raise CompensatableError("half booked")


@book.compensate
def _release(ctx: ToolContext, seats: int) -> dict[str, Any]:
    return {"released": seats}


@tool("pk_cancel_own_job")
def cancel_own_job(ctx: ToolContext, db: str) -> dict[str, Any]:
    """Cancels the job that runs it, while it runs (a person cancelling it meanwhile)."""
    store = open_store(db)
    try:
        cancel_job(store, ctx.job_id, reason="cancelled while a tool ran", by="tester")
    finally:
        store.close()
    return {"cancelled": True}


def plan(*nodes: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "pack-scenario", "retry": FAST_RETRY, "nodes": list(nodes), **extra}


def tool_node(node_id: str, name: str, deps: tuple[str, ...] = (), **args: Any) -> dict[str, Any]:
    kind = "pure" if name == "pk_quote" else "tool"
    return {"id": node_id, "type": kind, "tool": name, "args": args, "depends_on": list(deps)}


APPROVAL_PLAN = plan(
    tool_node("quote", "pk_quote", amount="${input.amount}"),
    {"id": "ok", "type": "approval", "depends_on": ["quote"]},
    tool_node("pay", "pk_pay", ("ok",), amount="${quote.amount}", answer="${ok}"),
)
SIGNAL_PLAN = plan(
    {"id": "go", "type": "wait"},
    tool_node("pay", "pk_pay", ("go",), amount="${input.amount}", answer="${go}"),
)
RETRY_PLAN = plan(tool_node("pay", "pk_flaky", amount="${input.amount}"))
FAILED_PLAN = plan(
    tool_node("pay", "pk_pay", amount="${input.amount}"),
    tool_node("decline", "pk_decline", ("pay",)),
    tool_node("after", "pk_pay", ("decline",), amount=1),
)
COMPENSATION_PLAN = plan(
    tool_node("pay", "pk_pay", amount="${input.amount}"),
    tool_node("book", "pk_book", ("pay",), seats=2),
)
PENDING_PLAN = plan(tool_node("pay", "pk_pay", amount="${input.amount}"))
RUNNING_CANCEL_PLAN = plan(
    tool_node("pay", "pk_pay", amount="${input.amount}"),
    tool_node("cancel", "pk_cancel_own_job", ("pay",), db="${input.db}"),
    tool_node("after", "pk_pay", ("cancel",), amount=1),
)


@agent("pk_approval_agent", version="1", retry=FAST_RETRY)
def approval_agent(ctx: AgentContext, amount: int) -> dict[str, Any]:
    decided = ctx.call(quote, amount=amount)
    answer = ctx.approval("big", payload=decided)
    return {"pay": ctx.call(pay, amount=decided["amount"], answer=answer)}


@agent("pk_signal_agent", version="1", retry=FAST_RETRY)
def signal_agent(ctx: AgentContext, amount: int) -> dict[str, Any]:
    got = ctx.wait("go")
    return {"pay": ctx.call(pay, amount=amount, answer=got)}


@agent("pk_sleep_agent", version="1", retry=FAST_RETRY)
def sleep_agent(ctx: AgentContext, amount: int) -> dict[str, Any]:
    first = ctx.call(pay, amount=amount)
    ctx.sleep(0)
    return {"first": first, "stamp": ctx.uuid()}


@agent("pk_timeout_agent", version="1", retry=FAST_RETRY)
def timeout_agent(ctx: AgentContext, amount: int) -> dict[str, Any]:
    got = ctx.wait("never", timeout_seconds=0)
    return {"pay": ctx.call(pay, amount=amount, answer=got)}


@agent("pk_retry_agent", version="1", retry=FAST_RETRY)
def retry_agent(ctx: AgentContext, amount: int) -> dict[str, Any]:
    return {"pay": ctx.call(flaky, amount=amount)}


@agent("pk_failed_agent", version="1", retry=FAST_RETRY)
def failed_agent(ctx: AgentContext, amount: int) -> dict[str, Any]:
    ctx.call(pay, amount=amount)
    ctx.call(decline)
    return {"unreachable": True}


@agent("pk_compensation_agent", version="1", retry=FAST_RETRY)
def compensation_agent(ctx: AgentContext, amount: int) -> dict[str, Any]:
    ctx.call(pay, amount=amount)
    return {"book": ctx.call(book, seats=2)}


@agent("pk_pending_agent", version="1", retry=FAST_RETRY)
def pending_agent(ctx: AgentContext, amount: int) -> dict[str, Any]:
    return {"pay": ctx.call(pay, amount=amount)}


@agent("pk_running_cancel_agent", version="1", retry=FAST_RETRY)
def running_cancel_agent(ctx: AgentContext, amount: int, db: str) -> dict[str, Any]:
    ctx.call(pay, amount=amount)
    ctx.call(cancel_own_job, db=db)
    return {"after": ctx.call(pay, amount=1)}


REGISTRY = ToolRegistry(
    [
        quote,
        pay,
        flaky,
        decline,
        book,
        cancel_own_job,
        approval_agent,
        signal_agent,
        sleep_agent,
        timeout_agent,
        retry_agent,
        failed_agent,
        compensation_agent,
        pending_agent,
        running_cancel_agent,
    ]
)
