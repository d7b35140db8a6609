"""Tools for the cancel tests, loaded by worker subprocesses (``affidavit worker --tools``) and
by the test process. Every tool takes ``dir``, a directory the test watches: a tool touches
``started`` when it is called and appends one line per real effect to ``effects.jsonl``
(one ``os.write`` on an ``O_APPEND`` descriptor: a SIGKILL right after leaves the line). The
slow ones wait for the test to create ``go`` (bounded): the test decides when the call ends.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from affidavit import AgentContext, ToolContext, ToolRegistry, agent, tool

GATE_SECONDS = 60.0  # how long a slow tool waits for its gate at most


def _effect(ctx: ToolContext, where: str) -> dict[str, Any]:
    line = json.dumps({"job": ctx.job_id, "node": ctx.node_id, "key": ctx.external_key}) + "\n"
    fd = os.open(Path(where) / "effects.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return {"effect": ctx.external_key}


def effects(where: str | Path) -> list[dict[str, Any]]:
    """Every effect that happened, in order."""
    path = Path(where) / "effects.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines()]


def _gate(ctx: ToolContext, where: str) -> None:
    (Path(where) / "started").touch()
    end = time.monotonic() + GATE_SECONDS
    while not (Path(where) / "go").exists() and time.monotonic() < end:
        time.sleep(0.02)


@tool("cancel_slow")
def slow(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """A call that runs until the test opens the gate, then acts (a slow API call)."""
    _gate(ctx, dir)
    return _effect(ctx, dir)


@tool("cancel_acts_then_hangs")
def acts_then_hangs(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """A call that acts, then hangs before it returns (the worker is killed meanwhile)."""
    result = _effect(ctx, dir)
    _gate(ctx, dir)
    return result


@acts_then_hangs.reconcile
def _found(ctx: ToolContext, dir: str) -> dict[str, Any] | None:
    """Did the dead attempt's call act? The effect names its external key."""
    for line in effects(dir):
        if line["key"] == ctx.external_key:
            return {"effect": line["key"]}
    return None


@tool("cancel_acts_then_hangs_nr")
def acts_then_hangs_nr(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """The same call without a reconcile hook: an effect in flight cannot be looked up."""
    result = _effect(ctx, dir)
    _gate(ctx, dir)
    return result


@tool("cancel_quick")
def quick(ctx: ToolContext, dir: str) -> dict[str, Any]:
    """A call that acts at once."""
    return _effect(ctx, dir)


@agent("cancel_agent", version="1")
def cancel_agent(ctx: AgentContext, dir: str) -> Any:
    """An agent job: the slow call, then a quick one (what a cancel must not start)."""
    first = ctx.call(slow, dir=dir)
    ctx.call(quick, dir=dir)
    return first


REGISTRY = ToolRegistry([slow, acts_then_hangs, acts_then_hangs_nr, quick, cancel_agent])


def one_step(tool_name: str, where: str | Path) -> dict[str, Any]:
    """One call: a cancel meets the job's completion after it."""
    plan = two_steps(tool_name, where)
    plan["nodes"] = plan["nodes"][:1]
    return plan


def two_steps(tool_name: str, where: str | Path, in_flight: str | None = None) -> dict[str, Any]:
    """``first`` (``tool_name``) → ``second`` (a quick call): what a cancel must not start."""
    plan: dict[str, Any] = {
        "name": "cancel-two-steps",
        "nodes": [
            {"id": "first", "type": "tool", "tool": tool_name, "args": {"dir": str(where)}},
            {
                "id": "second",
                "type": "tool",
                "tool": "cancel_quick",
                "args": {"dir": str(where)},
                "depends_on": ["first"],
            },
        ],
    }
    if in_flight is not None:
        plan["in_flight"] = in_flight
    return plan
