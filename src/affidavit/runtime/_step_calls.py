"""How a step's function is called, and how long a failed try waits before the next.

A call gets its own copy of the arguments and, with a time limit, runs on a daemon thread
(:func:`call_step`); a retry waits the policy's backoff, doubled per attempt
(:func:`backoff_delay`), and a run picking up a step an earlier run left in its backoff waits
only what is left of it (:func:`backoff_left`). The waiting itself, which a stopping worker or
a lost lease cuts short, is the executor's
(:meth:`~affidavit.runtime._step_executor.StepExecutor.backoff`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime
from typing import TYPE_CHECKING, Any

from affidavit.record import ReplayContext
from affidavit.runtime._run_base import own_args, unfit_call
from affidavit.runtime._sdk import ToolContext

if TYPE_CHECKING:
    from affidavit.runtime._step_executor import StepSpec

log = logging.getLogger("affidavit.runner")


class CallTimedOut(TimeoutError):
    """A call ran past its step's ``timeout_seconds`` and was abandoned (a thread cannot be
    killed: it may still act). Unlike a ``TimeoutError`` the function raised itself, its
    outcome is unknown (see :mod:`affidavit.runtime._timeouts`)."""


def call_step(
    spec: StepSpec, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
) -> Any:
    """Call ``fn`` (a tool, a pure function, a reconcile hook or a compensation) for the
    step, within its ``timeout_seconds`` if it has one (``TimeoutError``); the context
    records nothing afterwards."""
    # Each try gets its own copy: a tool that changes its arguments (or an abandoned
    # timed-out try still running) must not change what a retry, a compensation or a later
    # step sees — the resolved args share objects with the input and upstream outputs.
    args = own_args(args)
    try:
        if spec.timeout_seconds is None:
            return fn(ctx, **args)
        return _call_timed(spec, fn, ctx, args)
    except TypeError as exc:
        unfit = unfit_call(spec.node_id, fn, ctx, args)
        if unfit is None:  # the call fit: the error came from within the function
            raise
        raise unfit from exc
    finally:
        ctx.close(f"step {spec.node_id!r} (attempt {ctx.attempt}) is over")


def backoff_delay(backoff: float, attempt: int) -> float:
    """Seconds to wait after failed attempt ``attempt`` under the policy's ``backoff``: doubled
    per attempt, at most a minute."""
    # (2**1024 is past any float; by 2**1000 any backoff above 1e-299 s is at the cap)
    return min(backoff * 2.0 ** min(attempt - 1, 1000), 60.0)


def backoff_left(replay: ReplayContext, backoff: float, node_id: str) -> tuple[int, float] | None:
    """Before a step's first try in this run: when its last try, recorded by an earlier run
    (one that stopped or died in the backoff), failed retryably and no try started since, the
    attempt and the seconds left of that backoff — measured from the failure's recorded time —
    so that handing a job over does not hit a rate-limited service again at once. ``None``:
    no wait."""
    last = replay.node_finished.get(node_id)
    if (
        backoff <= 0
        or last is None
        or last.get("result_type") != "retryable_failure"
        or replay.node_attempts.get(node_id) != last.get("attempt")
    ):
        return None
    try:
        failed_at = datetime.fromisoformat(str(last["at"])).timestamp()
    except (KeyError, ValueError):
        return None  # (the log's shape was checked by the replay; a time it cannot read: no wait)
    delay = backoff_delay(backoff, int(last["attempt"]))
    # (another worker's clock may be ahead: never more than the backoff itself)
    return int(last["attempt"]), min(delay, failed_at + delay - time.time())


def _call_timed(
    spec: StepSpec, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
) -> Any:
    outcome: Future[Any] = Future()

    def call() -> None:
        try:
            outcome.set_result(fn(ctx, **args))
        except BaseException as exc:
            outcome.set_exception(exc)

    # A daemon thread, not a pool's: the interpreter joins a pool's threads at exit, so a
    # timed-out try that never returns would keep the worker process from ever exiting.
    threading.Thread(target=call, name=f"affidavit-{spec.node_id}", daemon=True).start()
    try:
        return outcome.result(timeout=spec.timeout_seconds)
    except FutureTimeout:
        # What the abandoned call does later is ignored: its outcome is decided (and
        # recorded) without it, and its context records nothing any more.
        outcome.add_done_callback(lambda done: _late(spec, ctx, done))
        raise CallTimedOut(
            f"step {spec.node_id!r} timed out after {spec.timeout_seconds}s"
        ) from None


def _late(spec: StepSpec, ctx: ToolContext, done: Future[Any]) -> None:
    """Log the late end of an abandoned call (nothing is recorded of it)."""
    failed = done.exception()
    log.warning(
        "job %s: the abandoned call of step %r (attempt %d) ended after its timeout, with %s; "
        "ignored (its outcome was decided without it)",
        ctx.job_id,
        spec.node_id,
        ctx.attempt,
        "a result" if failed is None else f"{type(failed).__name__}",
    )
