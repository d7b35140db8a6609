"""An agent that puts a canary string into every kind of payload a person or an agent supplies:
its input, a tool's arguments and result, a model-like pure step's request and response, a
stream value, a signal's payload, an approval's comment, and its output; and agents whose tool
error and own error carry one."""

from __future__ import annotations

import threading
from typing import Any

from affidavit import AgentContext, ToolContext, ToolRegistry, agent, pure, tool

CANARY = "canary-7f3a9c-ada.lovelace@example.org"


@tool("pv_send_email")
def send_email(ctx: ToolContext, to: str, body: str) -> dict[str, Any]:
    return {"sent_to": to, "echo": body}


@pure("pv_model")
def model(ctx: ToolContext, prompt: str) -> dict[str, Any]:
    return {"completion": f"reply about {prompt}"}


@tool("pv_fail")
def fail(ctx: ToolContext, who: str) -> dict[str, Any]:
    raise ValueError(f"no such customer {who}")


@agent("pv_everything", version="1")
def everything(ctx: AgentContext, email: str) -> dict[str, Any]:
    sent = ctx.call(send_email, to=email, body=f"hello {email}")
    reply = ctx.call(model, prompt=f"summarize {email}")
    ctx.emit({"progress": f"mailed {email}"})
    got = ctx.wait("details")
    decision = ctx.approval("send_summary", payload={"to": email})
    return {"sent": sent["sent_to"], "reply": reply, "got": got, "decision": decision}


@agent("pv_tool_error", version="1", retry={"max_attempts": 1, "backoff_seconds": 0})
def tool_error(ctx: AgentContext, email: str) -> Any:
    return ctx.call(fail, who=email)


@agent("pv_agent_error", version="1")
def agent_error(ctx: AgentContext, email: str) -> Any:
    raise RuntimeError(f"cannot handle {email}")


@agent("pv_simple", version="1")
def simple(ctx: AgentContext, email: str) -> Any:
    return ctx.call(send_email, to=email, body="hi")["sent_to"]


@agent("pv_parent", version="1")
def parent(ctx: AgentContext, email: str) -> Any:
    child = ctx.start_job("pv_simple", {"email": email})
    return ctx.join(child)


# ``pv_slow``: a call a test holds in flight (ENTERED once it runs, returns once GATE is set)
ENTERED, GATE = threading.Event(), threading.Event()


@tool("pv_slow")
def slow(ctx: ToolContext, email: str) -> dict[str, Any]:
    ENTERED.set()
    GATE.wait(60)
    return {"done_for": email}


@agent("pv_slow_agent", version="1")
def slow_agent(ctx: AgentContext, email: str) -> Any:
    return ctx.call(slow, email=email)


def registry() -> ToolRegistry:
    tools = [send_email, model, fail, slow, everything, tool_error, agent_error, simple, parent]
    return ToolRegistry([*tools, slow_agent])
