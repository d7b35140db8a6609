"""How a recorded step runs a coroutine of the job's agent-framework run (Pydantic AI, the
OpenAI Agents SDK).

affidavit runs a step's function on a step thread, synchronously; the model's and the tools'
coroutines belong to the job's event loop (their HTTP clients and MCP sessions were opened
there). So the run parks a coroutine factory under the step's argument hash before
``ctx.call``, and the step's function, given only its arguments, claims it here and runs it on
that loop. Two calls with equal arguments running at once (parallel tool calls of one turn)
each claim their own factory; a retried step runs the factory it claimed again.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from affidavit import AgentContext, Tool, ToolContext, canonical_sha256

#: Makes the coroutine a step runs, given the step's context.
Make = Callable[[ToolContext], Coroutine[Any, Any, Any]]

#: The step whose coroutine is running (what an MCP call passes in ``_meta``).
CURRENT_STEP: ContextVar[ToolContext | None] = ContextVar("affidavit_bridge_step", default=None)


@dataclass
class _JobBridge:
    loop: asyncio.AbstractEventLoop
    thread: int
    users: int = 0
    pending: dict[str, list[Make]] = field(default_factory=dict)
    claimed: dict[str, Make] = field(default_factory=dict)  # step id -> its factory


_LOCK = threading.Lock()
_JOBS: dict[str, _JobBridge] = {}


def open_bridge(job_id: str) -> None:
    """Make the running loop the one this job's steps run their coroutines on."""
    with _LOCK:
        bridge = _JOBS.get(job_id)
        if bridge is None:
            bridge = _JOBS[job_id] = _JobBridge(asyncio.get_running_loop(), threading.get_ident())
        bridge.users += 1


def close_bridge(job_id: str) -> None:
    with _LOCK:
        bridge = _JOBS.get(job_id)
        if bridge is not None:
            bridge.users -= 1
            if bridge.users <= 0:
                del _JOBS[job_id]


async def record(ctx: AgentContext, step: Tool, args: dict[str, Any], make: Make) -> Any:
    """``ctx.call(step, **args)``, whose step (when it runs: not on a recorded replay) runs the
    coroutine ``make(step_context)`` makes. Returns the step's result as recorded."""
    key = canonical_sha256(args)
    with _LOCK:
        bridge = _JOBS[ctx.job_id]
        bridge.pending.setdefault(key, []).append(make)
    try:
        answer = ctx.call(step, **args)
        return await answer if inspect.isawaitable(answer) else answer
    finally:
        with _LOCK:
            waiting = bridge.pending.get(key, [])
            if make in waiting:
                waiting.remove(make)
            if not waiting:
                bridge.pending.pop(key, None)
            for step_id in [s for s, m in bridge.claimed.items() if m is make]:
                del bridge.claimed[step_id]


def run_pending(ctx: ToolContext, args: dict[str, Any], *, run_by: str) -> Any:
    """In a step's function: run the coroutine its call parked, and return its value.

    Raises:
        RuntimeError: the step runs outside the framework's run that called it (``run_by``
            names it; a worker recovering a job is never here: its agent function makes the
            call again).
    """
    with _LOCK:
        bridge = _JOBS.get(ctx.job_id)
        make = bridge.claimed.get(ctx.step_id) if bridge is not None else None
        if bridge is not None and make is None:
            waiting = bridge.pending.get(canonical_sha256(args))
            if waiting:
                make = bridge.claimed[ctx.step_id] = waiting.pop(0)
    if bridge is None or make is None:
        raise RuntimeError(
            f"step {ctx.step_id} of job {ctx.job_id} runs outside the {run_by} that makes it"
        )

    async def run() -> Any:
        token = CURRENT_STEP.set(ctx)
        try:
            return await make(ctx)
        finally:
            CURRENT_STEP.reset(token)

    if threading.get_ident() != bridge.thread:
        return asyncio.run_coroutine_threadsafe(run(), bridge.loop).result()
    # a step run on the loop's own thread (a call that asks for an approval runs alone, there):
    # waiting on the busy loop would never return
    with ThreadPoolExecutor(1, thread_name_prefix="affidavit-bridge") as helper:
        return helper.submit(asyncio.run, run()).result()
