"""Tools for the schedule tests, loaded by worker subprocesses (``affidavit worker --tools``)
and by the test process. ``sched_mark`` appends one line per real effect to
``DIR/effects.jsonl`` (one ``os.write`` on an ``O_APPEND`` descriptor: a SIGKILL right after
leaves the line), naming the job and the call's external key; its reconcile hook looks the
dead attempt's key up there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from affidavit import AgentContext, ToolContext, ToolRegistry, agent, tool


@tool("sched_mark")
def mark(ctx: ToolContext, dir: str) -> dict[str, Any]:
    line = json.dumps({"job": ctx.job_id, "node": ctx.node_id, "key": ctx.external_key}) + "\n"
    fd = os.open(Path(dir) / "effects.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return {"effect": ctx.external_key}


@mark.reconcile
def _found(ctx: ToolContext, dir: str) -> dict[str, Any] | None:
    for line in effects(dir):
        if line["key"] == ctx.external_key:
            return {"effect": line["key"]}
    return None


def effects(where: str | Path) -> list[dict[str, Any]]:
    """Every effect that happened, in order."""
    path = Path(where) / "effects.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines()]


@agent("sched_agent", version="1")
def sched_agent(ctx: AgentContext, dir: str) -> Any:
    """A scheduled job: one effect."""
    return ctx.call(mark, dir=dir)


REGISTRY = ToolRegistry([mark, sched_agent])
