"""Tools for the queue fleet tests, imported by the test and by the worker subprocesses.

``hold`` is an effect that lasts: it writes a ``start`` line (the effect, with its external
key and the time) to the side channel, holds for ``seconds``, then writes an ``end`` line. The
lines are single ``os.write`` calls on an ``O_APPEND`` descriptor (see
tests/runtime/crash_tools.py), so a worker killed inside the call leaves its start line, and
the reconcile hook finds the effect instead of running it again.
"""

from __future__ import annotations

import time
from typing import Any

from affidavit import ToolContext, ToolRegistry, tool
from tests.runtime.crash_tools import read_side, record


@tool("queue_hold")
def hold(ctx: ToolContext, side: str, seconds: float) -> dict[str, Any]:
    record(side, kind="start", job=ctx.job_id, key=ctx.external_key, t=time.time())
    time.sleep(seconds)
    record(side, kind="end", job=ctx.job_id, key=ctx.external_key, t=time.time())
    return {"held": ctx.external_key}


@hold.reconcile
def _hold_reconcile(ctx: ToolContext, side: str, seconds: float) -> dict[str, Any] | None:
    for line in read_side(side):
        if line["kind"] == "start" and line["key"] == ctx.external_key:
            return {"held": line["key"]}
    return None


REGISTRY = ToolRegistry([hold])


def hold_plan() -> dict[str, Any]:
    return {
        "name": "hold",
        "nodes": [
            {
                "id": "hold",
                "type": "tool",
                "tool": "queue_hold",
                "args": {"side": "${input.side}", "seconds": "${input.seconds}"},
            }
        ],
    }
