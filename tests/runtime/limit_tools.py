"""Tools for the limit fleet test, imported by the test and by the ``affidavit worker``
subprocesses (``--tools tests.runtime.limit_tools``).

``limited_hold`` is a limited effect that lasts: it writes a ``start`` line (with its worker's
pid, the job and the time) to the side channel, holds for ``seconds``, then writes an ``end``
line — single ``os.write`` calls on an ``O_APPEND`` descriptor (tests/runtime/crash_tools.py),
so a worker killed inside the call leaves its start line, and the reconcile hook finds the
effect instead of running it again.
"""

from __future__ import annotations

import os
import time
from typing import Any

from affidavit import Limit, ToolContext, ToolRegistry, tool
from tests.runtime.crash_tools import read_side, record

CONCURRENCY = 2
RATE = "3/1s"
LIMIT = Limit(rate=RATE, concurrency=CONCURRENCY, name="fleet-limit")


@tool("limited_hold", limit=LIMIT)
def limited_hold(ctx: ToolContext, side: str, seconds: float) -> dict[str, Any]:
    record(side, kind="start", job=ctx.job_id, key=ctx.external_key, pid=os.getpid(), t=time.time())
    time.sleep(seconds)
    record(side, kind="end", job=ctx.job_id, key=ctx.external_key, pid=os.getpid(), t=time.time())
    return {"held": ctx.external_key}


@limited_hold.reconcile
def _reconcile(ctx: ToolContext, side: str, seconds: float) -> dict[str, Any] | None:
    for line in read_side(side):
        if line["kind"] == "start" and line["key"] == ctx.external_key:
            return {"held": line["key"]}
    return None


REGISTRY = ToolRegistry([limited_hold])


def hold_plan() -> dict[str, Any]:
    return {
        "name": "limited-hold",
        "nodes": [
            {
                "id": "hold",
                "type": "tool",
                "tool": "limited_hold",
                "args": {"side": "${input.side}", "seconds": "${input.seconds}"},
            }
        ],
    }
