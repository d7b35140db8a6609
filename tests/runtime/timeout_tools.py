"""Tools for the per-call timeout and cooperative cancel tests, loaded by worker subprocesses
(``affidavit worker --tools``) and by the test process. Every tool takes ``dir``, a directory
the test watches: an effect is one line in ``effects.jsonl`` (as in
:mod:`tests.runtime.cancel_tools`); a call that hangs waits for the test to create ``go``
(bounded), then touches ``returned`` as it returns — the late end of an abandoned call.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from affidavit import AgentContext, ToolContext, ToolRegistry, agent, tool

GATE_SECONDS = 60.0  # how long a call hangs (or loops) at most


def effects(where: str | Path) -> list[dict[str, Any]]:
    """Every effect that happened, in order."""
    path = Path(where) / "effects.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines()]


def effect(ctx: ToolContext, where: str) -> dict[str, Any]:
    """One effect, named by the call's external key (one write on an O_APPEND descriptor)."""
    line = json.dumps({"job": ctx.job_id, "node": ctx.node_id, "key": ctx.external_key}) + "\n"
    fd = os.open(Path(where) / "effects.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return {"effect": ctx.external_key}


def _hang(dir: str) -> None:
    end = time.monotonic() + GATE_SECONDS
    while not (Path(dir) / "go").exists() and time.monotonic() < end:
        time.sleep(0.02)


def _acts_then_hangs(ctx: ToolContext, dir: str) -> dict[str, Any]:
    result = effect(ctx, dir)
    _hang(dir)
    (Path(dir) / "returned").touch()
    return result


@tool("to_pay")
def pay(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """A payment that acts, then does not answer: neither idempotent nor reconcilable."""
    return _acts_then_hangs(ctx, dir)


@tool("to_pay_default", timeout_seconds=0.3)
def pay_default(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """The same payment, with its own time limit (no node or call gives one)."""
    return _acts_then_hangs(ctx, dir)


@tool("to_put", idempotent=True, timeout_seconds=0.3)
def put(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """An idempotent write (a PUT): its first call hangs, a second one answers at once."""
    if effects(dir):
        return effect(ctx, dir)
    return _acts_then_hangs(ctx, dir)


@tool("to_pay_found")
def pay_found(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """A payment that acts, then hangs, with a reconcile hook that looks the effect up."""
    return _acts_then_hangs(ctx, dir)


@pay_found.reconcile
def _look_up(ctx: ToolContext, dir: str) -> dict[str, Any] | None:
    for line in effects(dir):
        if line["key"] == ctx.external_key:
            return {"effect": line["key"]}
    return None


@tool("to_slow_found")
def slow_found(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """A payment whose first call hangs before it acts (and never acts), with a reconcile hook:
    the hook finds nothing, and the next try acts at once."""
    tried = Path(dir) / "tried"
    if tried.exists():
        return effect(ctx, dir)
    tried.touch()
    _hang(dir)
    (Path(dir) / "returned").touch()
    return {"effect": None}


slow_found.reconcile(_look_up)


@tool("to_loop")
def loop(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """A long job in small units: it looks at ``ctx.cancelled`` between them and stops when
    its job is asked to cancel (bounded: 60 s)."""
    (Path(dir) / "started").touch()
    end = time.monotonic() + GATE_SECONDS
    units = 0
    while time.monotonic() < end:
        if ctx.cancelled:
            (Path(dir) / "stopped").touch()
        ctx.check_cancelled()
        units += 1
        time.sleep(0.02)
    return {"units": units}


@agent("to_agent", version="1")
def pay_agent(ctx: AgentContext, dir: str) -> Any:
    """An agent job whose payment call has a time limit of its own."""
    return ctx.call(pay, timeout_seconds=0.3, dir=dir)


@agent("to_loop_agent", version="1")
def loop_agent(ctx: AgentContext, dir: str) -> Any:
    """An agent job whose one call is the long loop."""
    return ctx.call(loop, dir=dir)


@agent("to_sleeper", version="1")
def sleeper(ctx: AgentContext, dir: str, how: str) -> Any:
    """An agent job that sleeps an hour (or waits for a signal), then pays."""
    if how == "sleep":
        ctx.sleep(3600)
    else:
        ctx.wait("never", timeout_seconds=3600)
    return ctx.call(pay, dir=dir)


REGISTRY = ToolRegistry(
    [pay, pay_default, put, pay_found, slow_found, loop, pay_agent, loop_agent, sleeper]
)


def one_call(tool_name: str, where: str | Path, timeout: float | None = 0.3) -> dict[str, Any]:
    """A plan of one call (``timeout``: the node's ``timeout_seconds``)."""
    node: dict[str, Any] = {"id": "call", "type": "tool", "tool": tool_name}
    node["args"] = {"dir": str(where)}
    if timeout is not None:
        node["timeout_seconds"] = timeout
    return {"name": "timeouts", "retry": {"max_attempts": 3, "backoff_seconds": 0}, "nodes": [node]}
