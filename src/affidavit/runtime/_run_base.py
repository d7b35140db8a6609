"""What every run shares: the claim, how a run ends early (:class:`Stop`, :class:`StepFailed`),
waits through a database outage, and the small encoders and checks of step events.

The writes themselves go through :class:`~affidavit.runtime._journal.Journal`; one step through
:class:`~affidavit.runtime._step_executor.StepExecutor`.
"""

from __future__ import annotations

import copy
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from affidavit.core.canonical import canonical_nested, parse
from affidavit.core.config import DEFAULT_MAX_RECOVERIES as DEFAULT_MAX_RECOVERIES
from affidavit.core.config import DEFAULT_STORE_RETRY_SECONDS as DEFAULT_STORE_RETRY_SECONDS
from affidavit.core.errors import CanonicalizationError, StoreUnavailable
from affidavit.runtime._sdk import Tool, ToolCallError, ToolContext
from affidavit.store import NextClaim, StoredEvent, Transaction

_RETRY_FIRST_WAIT = 0.05
_RETRY_MAX_WAIT = 1.0

log = logging.getLogger("affidavit.runner")


class Outage:
    """A run's waits while the database is unavailable: 50 ms, doubling up to 1 s, for up to
    ``retry_seconds`` after the first failure. ``check_lease`` raises :class:`Stop` when a
    heartbeat found the lease taken (no use waiting then)."""

    __slots__ = ("_check_lease", "_job_id", "_retry_seconds", "_started", "_wait")

    def __init__(self, job_id: str, retry_seconds: float, check_lease: Callable[[], None]) -> None:
        self._job_id = job_id
        self._retry_seconds = retry_seconds
        self._check_lease = check_lease
        self._started: float | None = None
        self._wait = _RETRY_FIRST_WAIT

    def wait(self, exc: StoreUnavailable, doing: str) -> bool:
        """Log ``exc`` and wait before the next try; ``False`` (no wait) once the run has
        tried for ``retry_seconds``.

        Raises:
            Stop: ``"lost"``, when a heartbeat found the lease taken.
        """
        now = time.monotonic()
        self._started = now if self._started is None else self._started
        if now - self._started >= self._retry_seconds:
            log.error(
                "job %s: the database stayed unavailable for %.0f s; giving up %s: %s",
                self._job_id,
                now - self._started,
                doing,
                exc,
            )
            return False
        (log.warning if self._wait == _RETRY_FIRST_WAIT else log.debug)(
            "job %s: the database is unavailable (%s); %s, for up to %.0f s",
            self._job_id,
            exc,
            doing,
            self._retry_seconds,
        )
        self._check_lease()
        time.sleep(self._wait)  # not cut short by a stop: the step's record is what it awaits
        self._wait = min(self._wait * 2, _RETRY_MAX_WAIT)
        return True


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim (lease) of a job by a worker."""

    job_id: str
    attempt_id: str
    worker_id: str
    lease_expires_at: float | None = None  # as the claim wrote it (seconds since the epoch)
    # the lease had expired with an owner, and what the recoveries before recorded (see
    # affidavit.store.Claimed)
    recovered: bool = False
    recoveries: int = 0
    progress: int | None = None
    # the job's log as the claim read it, if it did (affidavit.store.Claimed.log): the run
    # starts from it instead of reading it again
    log: tuple[StoredEvent, ...] | None = None
    # makes the worker's next claim when the transaction that ends this job is written, to go
    # with it (affidavit.store.NextClaim): no round trip of its own where the store allows;
    # None from it: no claim is wanted (the worker stops)
    next_claim: Callable[[], NextClaim | None] | None = field(default=None, compare=False)
    # tells the worker's claim loops that this run made jobs runnable (a fan-out's children,
    # committed): a loop waiting for it to end claims now
    made_runnable: Callable[[], None] | None = field(default=None, compare=False)


class StepFailed(Exception):
    """A node failed for good; the job fails with ``error``."""

    def __init__(self, node_id: str, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.node_id = node_id
        self.error = error


class Stop(Exception):
    """The run ends without completing: the job is waiting, parked, or the lease was lost."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class StopAwareSleep:
    """A worker's own wait between a step's tries: cut short when the worker is asked to stop
    and, given ``over``, as soon as it says so (the run ends, or a heartbeat found the lease
    lost: the job was cancelled or taken over, and the next try could write nothing)."""

    __slots__ = ("_stopping",)
    _SLICE = 0.1  # how often ``over`` is asked

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping

    def __call__(self, seconds: float, over: Callable[[], bool] | None = None) -> None:
        if over is None:
            self._stopping.wait(seconds)
            return
        end = time.monotonic() + seconds
        while not over() and not self._stopping.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return
            self._stopping.wait(min(left, self._SLICE))


def check_lease(lease_lost: threading.Event | None) -> None:
    """Stop the run (``"lost"``) when a heartbeat found its lease taken."""
    if lease_lost is not None and lease_lost.is_set():
        raise Stop("lost")


def error_dict(exc: BaseException) -> dict[str, Any]:
    """A step's error as recorded. It must always be recordable: a failure that cannot be
    written leaves its step to run again on every pickup. So a message that is not valid
    Unicode (a lone surrogate, from a file name decoded with ``surrogateescape`` say) is
    escaped, and one that cannot be read at all is named as such."""
    try:
        message = str(exc)[:2000]
    except Exception:
        message = "(the exception's message could not be read)"
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"type": type(exc).__name__, "message": message}


# A payload the runner builds for a step holds only ids, names, counters, booleans, a duration
# and already-canonical values wrapped in orjson.Fragment. For those, orjson with sorted keys
# writes exactly the JCS bytes (core.canonical's fast path: strings, integers within ±(2^53-1),
# non-integral doubles from 1e-4 up, ASCII keys), so the walk that checks arbitrary values is
# skipped. Tests re-canonicalize every payload such runs store.
_STEP_PAYLOAD = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER

Item = tuple[str, dict[str, Any]]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def unfit_call(
    node_id: str, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
) -> ToolCallError | None:
    """Why ``fn(ctx, **args)`` raised a ``TypeError`` before ``fn`` ran — its parameters do not
    take the step's context and these arguments — as a :class:`ToolCallError` naming the node,
    the function's parameters and the arguments given; ``None`` when the call fits (the error
    came from within the function) or the function's parameters cannot be read."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins and callables)
        return None
    try:
        signature.bind(ctx, **args)
    except TypeError as exc:
        reason = str(exc)
    else:
        return None
    name = getattr(fn, "__name__", None) or repr(fn)
    params = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    shown = signature.replace(parameters=params, return_annotation=signature.empty)
    message = (
        f"step {node_id!r}: {name}{shown} cannot be called as {name}(ctx, **args) with "
        f"args ({', '.join(args) or 'none'}): {reason}"
    )
    first = params[0] if params else None
    if first is None or first.kind not in (*_POSITIONAL, inspect.Parameter.VAR_POSITIONAL):
        message += "; its first parameter must take the step's context"
    elif first.name in args and first.kind in _POSITIONAL:
        message += (
            f"; the first parameter takes the step's context: def {name}(ctx, {first.name}, ...)"
        )
    return ToolCallError(message)


def step_payload(payload: dict[str, Any]) -> bytes:
    """The JCS bytes of a payload built by the runner (see above)."""
    try:
        return orjson.dumps(payload, option=_STEP_PAYLOAD)
    except orjson.JSONEncodeError as exc:  # a lone surrogate in a name, say
        raise CanonicalizationError(f"a step event cannot be recorded: {exc}") from None


_SCALARS = frozenset({str, int, float, bool, type(None)})


def own_args(args: dict[str, Any]) -> dict[str, Any]:
    """A copy of resolved args for one call: what the callee changes in place changes nothing
    else (they share objects with the input and upstream outputs). Args of scalars only — the
    usual case — need no deep copy."""
    for value in args.values():
        if type(value) not in _SCALARS:
            return copy.deepcopy(args)
    return dict(args)


def open_closings(
    tx: Transaction, job_id: str, error: dict[str, Any], *, skip: str | None = None
) -> list[Item]:
    """The events that close every invocation still open in the ledger (begun, never
    finished) — ``tool_invocation_finished`` as ``unknown``, ``catch_up`` (the tool may or may
    not have acted; never ``lost``, which says the effect did not happen) — for a transaction
    that ends the job, so that it ends with no key pending (docs/formats.md §3). Reads only.
    ``skip``: a key the caller closes itself."""
    return [
        (
            "tool_invocation_finished",
            {
                "node_id": row.node_id,
                "step_id": row.step_id,
                "invocation_id": row.invocation_id,
                "idempotency_key": row.idempotency_key,
                "outcome": "unknown",
                "catch_up": True,
                "error": error,
            },
        )
        for row in tx.ledger_open(job_id)
        if row.idempotency_key != skip
    ]


def fail_closed(tx: Transaction, job_id: str, closings: list[Item], error: dict[str, Any]) -> None:
    """Mark the ledger rows of ``closings`` (see :func:`open_closings`) failed with ``error``.
    Called once the job's row is locked (its events appended, on PostgreSQL), so that every
    writer takes the job's lock before its ledger rows' and none waits on another in a cycle."""
    for _, payload in closings:
        tx.ledger_finish(job_id, payload["idempotency_key"], status="failed", error=error)


def close_open_invocations(
    tx: Transaction, job_id: str, error: dict[str, Any], *, skip: str | None = None
) -> list[Item]:
    """:func:`open_closings`, with their ledger rows marked failed at once: for a transaction
    that has locked the job's row already (a person's decision), which appends the returned
    events before the job's last event."""
    closings = open_closings(tx, job_id, error, skip=skip)
    fail_closed(tx, job_id, closings, error)
    return closings


def recorded(jcs: bytes) -> Any:
    """A step's output or result as the log holds it (``jcs``, its canonical bytes), for the
    steps that take it as their input: exactly what a run that replays the log reads. Not the
    object the function returned: that may change after it was recorded (an object the function
    keeps and changes again, say), and its lookups may differ from the recorded JSON's (a tuple
    is a list once recorded) — either would give the steps after it other args, hence other
    idempotency keys, than a recovery derives, and an invocation in flight would go unseen."""
    return parse(jcs)


def check_result(node_id: str, t: Tool, value: Any) -> bytes:
    """A result is recorded as canonical JSON: its bytes; if it cannot be, say which node
    returned it."""
    try:
        return canonical_nested(value)  # (recorded again inside the job's output)
    except CanonicalizationError as exc:
        raise CanonicalizationError(
            f"{t.kind} {t.name!r} of node {node_id!r} returned a value that cannot be "
            f"recorded: {exc.reason}",
            path=exc.path,
            hint=exc.hint,
        ) from exc


def elapsed_ms(t0: float) -> float | int:
    """Milliseconds since ``t0`` to the microsecond; a whole number as an ``int`` (JCS writes
    ``5.0`` as ``5`` either way; this keeps it on the fast encoder's path)."""
    ms = round((time.perf_counter() - t0) * 1000, 3)
    return int(ms) if ms.is_integer() else ms
