"""An agent whose stream a test reads while it runs: it emits, then holds in a pure step until
the test opens its gate, then emits again (imported by the test process only)."""

from __future__ import annotations

import threading
from typing import Any

from affidavit import AgentContext, ToolContext, ToolRegistry, agent, pure

GATES: dict[str, threading.Event] = {}  # job id -> the gate its held step waits on


@pure("held")
def held(ctx: ToolContext) -> str:
    gate = GATES.setdefault(ctx.job_id, threading.Event())
    ctx.emit({"held": True})
    if not gate.wait(60):
        raise TimeoutError("the test never opened the gate")
    return "released"


@agent("gated_agent", version="1")
def gated_agent(ctx: AgentContext, fail: bool = False) -> dict[str, Any]:
    ctx.emit("first")
    ctx.call(held)
    ctx.emit("second")
    if fail:
        raise ValueError("asked to fail")
    return {"done": True}


TOOLS = ToolRegistry([held, gated_agent])
