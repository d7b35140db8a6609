"""Agent jobs written as code: ``@affidavit.agent`` and the :class:`AgentContext` it receives.

An agent is a function ``fn(ctx, **input)`` (``def`` or ``async def``) whose every
``ctx.call``, ``ctx.wait``, ``ctx.approval``, ``ctx.sleep``, ``ctx.now/uuid/random`` and
``ctx.patched`` records one step, numbered in program order. Recovery runs the function again
from the top: recorded steps return their recorded results without executing, the first
unrecorded one continues the job, and a call that differs from its record parks the job as
``nondeterministic``. See docs/runtime.md ("Agent jobs").
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from affidavit.core.approvals import ApprovalPolicy
from affidavit.core.budget import Budget
from affidavit.core.errors import AffidavitError
from affidavit.core.streams import StreamLimit
from affidavit.runtime._sdk import Tool, ToolError, check_timeout, registry

#: How many calls of one agent job run at once unless the agent says otherwise.
DEFAULT_MAX_CONCURRENCY = 8
_MAX_NAME = 200

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, eq=False)
class Agent:
    """A registered agent function. ``version`` is recorded with every job it runs: ``None``
    (the default, not pinned) lets any code of the agent continue a job whose recorded calls
    it reproduces; a pinned version runs only on workers whose agent has that version.
    ``code_sha256`` (the SHA-256 of the module's source, ``None`` when it cannot be read) is
    recorded for information with the job and each step this code calls."""

    name: str
    fn: Callable[..., Any]
    version: str | None
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    in_flight: str = "park"
    retry: dict[str, Any] = field(
        default_factory=lambda: {"max_attempts": 3, "backoff_seconds": 1.0}
    )
    replay_verification: str = "strict"
    budget: Budget | None = None  # recorded in agent_started (core/budget.py)
    stream: StreamLimit | None = None  # recorded in agent_started (core/streams.py)
    code_sha256: str | None = None

    def refusal(self, recorded: str | None) -> str | None:
        """Why this agent must not run a job whose ``agent_started`` recorded version
        ``recorded``, else ``None``: a pinned version on either side must match. A 16-hex
        version recorded by an earlier release, whose default was the first 16 hex of the
        source's hash, runs on an unpinned agent whose source has that hash."""
        if recorded == self.version or (
            self.version is None
            and self.code_sha256 is not None
            and recorded == self.code_sha256[:16]
        ):
            return None
        return (
            f"agent {self.name!r} version {_shown(recorded)} "
            f"(this worker has version {_shown(self.version)})"
        )

    @property
    def is_async(self) -> bool:
        """Whether the function is an ``async def`` (its ``ctx`` calls are awaited)."""
        return inspect.iscoroutinefunction(self.fn)

    def policy(self) -> dict[str, Any]:
        """The policy recorded in ``agent_started``."""
        return {
            "in_flight": self.in_flight,
            "replay_verification": self.replay_verification,
            "retry": dict(self.retry),
            "max_concurrency": self.max_concurrency,
        }

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _shown(version: str | None) -> str:
    return "unpinned" if version is None else repr(version)


def source_sha256(fn: Callable[..., Any]) -> str | None:
    """The hex SHA-256 of the source of ``fn``'s module (of the function's own source when
    the module's cannot be read; ``None`` when neither can): which code ran, for the record."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    source: str | None = None
    for obj in (module, fn):
        if obj is None:
            continue
        try:
            source = inspect.getsource(obj)
            break
        except (OSError, TypeError):
            continue
    if source is None:
        return None
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def agent(
    name: str,
    *,
    version: str | None = None,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    in_flight: str = "park",
    retry: dict[str, Any] | None = None,
    replay_verification: str = "strict",
    budget: Budget | None = None,
    stream: StreamLimit | None = None,
) -> Callable[[Callable[..., Any]], Agent]:
    """Register an agent function under ``name`` (in the module-level registry, which
    ``--tools`` modules fill). ``version`` pins the jobs it runs to workers with that
    version; by default (``None``) any code of the agent continues a job whose recorded calls
    it reproduces (a divergent call parks the job as ``nondeterministic``).
    ``max_concurrency`` bounds the calls of one job that run at once; ``in_flight``,
    ``retry`` and ``replay_verification`` are the job's policy, as a plan's. ``budget``
    (:class:`~affidavit.Budget`), recorded with each job: the call that would exceed it does
    not run, the job parks as ``budget_exceeded`` (``affidavit resume --decision continue
    --budget JSON`` sets a new one). ``stream`` (:class:`~affidavit.StreamLimit`), recorded
    with each job: how many values and bytes ``ctx.emit`` may add to the job's stream (by
    default 10,000 values, 16 MiB).

    Raises:
        ToolError: a bad name or option, or another agent under ``name``.
    """
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME or not name.isprintable():
        raise ToolError(f"agent name {name!r} must be printable text of 1 to {_MAX_NAME} chars")
    if version is not None and (not isinstance(version, str) or not version):
        raise ToolError(f"agent {name!r}: version must be non-empty text, not {version!r}")
    if type(max_concurrency) is not int or max_concurrency < 1:
        raise ToolError(f"agent {name!r}: max_concurrency must be an integer ≥ 1")
    if in_flight not in ("park", "fail"):
        raise ToolError(f"agent {name!r}: in_flight must be 'park' or 'fail', not {in_flight!r}")
    if replay_verification not in ("strict", "warn", "human"):
        raise ToolError(
            f"agent {name!r}: replay_verification must be strict, warn or human, "
            f"not {replay_verification!r}"
        )
    policy_retry = {"max_attempts": 3, "backoff_seconds": 1.0, **(retry or {})}
    attempts, backoff = policy_retry["max_attempts"], policy_retry["backoff_seconds"]
    if type(attempts) is not int or attempts < 1 or not isinstance(backoff, int | float):
        raise ToolError(f"agent {name!r}: retry needs max_attempts ≥ 1 and backoff_seconds")
    if budget is not None and not isinstance(budget, Budget):
        raise ToolError(f"agent {name!r}: budget must be an affidavit.Budget, not {budget!r}")
    if stream is not None and not isinstance(stream, StreamLimit):
        raise ToolError(f"agent {name!r}: stream must be an affidavit.StreamLimit, not {stream!r}")

    def register(fn: Callable[..., Any]) -> Agent:
        if not callable(fn):
            raise ToolError(f"@agent({name!r}) decorates {fn!r}, which is not a function")
        made = Agent(
            name,
            fn,
            version,
            max_concurrency,
            in_flight,
            {"max_attempts": attempts, "backoff_seconds": float(backoff)},
            replay_verification,
            budget,
            stream,
            source_sha256(fn),
        )
        registry.add_agent(made)
        return made

    return register


class StepHandle(Protocol):
    """A call started with :meth:`AgentContext.start`: :meth:`result` waits for it."""

    def result(self) -> Any: ...


class _Backend(Protocol):
    """What an :class:`AgentContext` asks of the run that executes its job."""

    job_id: str
    input: Any

    def call(
        self, target: Tool | str, args: dict[str, Any], *, start: bool, timeout: float | None
    ) -> Any: ...

    def gather(self, handles: Iterable[Any]) -> list[Any]: ...

    def wait(
        self, kind: str, key: str, args: dict[str, Any], timeout: float | None, *, start: bool
    ) -> Any: ...

    def sleep(self, seconds: float, *, start: bool) -> Any: ...

    def value(self, kind: str, args: dict[str, Any], make: Callable[[], Any]) -> Any: ...

    def patched(self, patch_id: str) -> bool: ...

    def emit(self, value: Any) -> None: ...
    def start_job(self, target: Any, job_input: Any, queue: str | None, *, start: bool) -> Any: ...

    def start_jobs(
        self, target: Any, inputs: list[Any], queue: str | None, *, start: bool
    ) -> Any: ...

    def join(self, handles: Iterable[Any], *, start: bool) -> Any: ...


class AgentContext:
    """What an agent function is given: its job's identity and input, and the calls that
    record steps. Every method that records takes the next sequence number in program order.

    In an ``async def`` agent, :meth:`call`, :meth:`wait`, :meth:`approval` and :meth:`sleep`
    return awaitables (``await ctx.call(...)``; ``asyncio.gather`` runs calls concurrently);
    in a plain ``def`` agent they return the value, and :meth:`start` / :meth:`gather` run
    calls concurrently. :meth:`now`, :meth:`uuid`, :meth:`random` and :meth:`patched` return
    their value in both.

    A step that fails for good (after its retries), a park, a wait and a lost lease end the
    function's run by raising an exception it must not catch (a :class:`BaseException`, as
    ``KeyboardInterrupt`` is): the job fails, waits or parks as a plan job would.
    """

    __slots__ = ("_async", "_backend")

    def __init__(self, backend: _Backend, *, is_async: bool) -> None:
        self._backend = backend
        self._async = is_async

    @staticmethod
    def current() -> AgentContext | None:
        """The context of the agent job whose function is running here (in its thread, or in
        a task of its event loop), else ``None``: what a framework adapter called from inside
        an agent function (``AffidavitRunner.run``) records its steps with."""
        return _CURRENT.get()

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self._backend.job_id

    @property
    def input(self) -> Any:
        """The job's input, as submitted (the agent function's keyword arguments)."""
        return self._backend.input

    def call(
        self, tool: Tool | str, /, *, timeout_seconds: float | None = None, **args: Any
    ) -> Any:
        """Call a ``@tool`` or ``@pure`` function (the object or its registered name) with
        ``args`` as one step: a tool through the invocation ledger (at most once, reconciled
        or parked when caught in flight), a pure function once (its output recorded). On
        recovery a recorded call returns its recorded result without running. Returns the
        result as recorded (JSON values), or an awaitable of it in an async agent.

        ``timeout_seconds``: each try's time limit (default: the tool's own). A tool call past
        it has an unknown outcome, resolved by the tool's reconcile hook, else tried again
        only for an ``idempotent`` tool, else the job parks (docs/runtime.md, "Timeouts").

        Raises:
            BaseException subclass: the step failed for good, or the job parked or must stop.
            ConfigError: ``timeout_seconds`` is not a number > 0.
        """
        check_timeout("ctx.call", timeout_seconds)
        return self._backend.call(tool, args, start=self._async, timeout=timeout_seconds)

    def start(
        self, tool: Tool | str, /, *, timeout_seconds: float | None = None, **args: Any
    ) -> StepHandle:
        """Start :meth:`call` without waiting for it (plain ``def`` agents): the step takes
        its sequence number now and runs concurrently, at most the agent's
        ``max_concurrency`` at once; ``handle.result()`` (or :meth:`gather`) waits for it."""
        if self._async:
            raise TypeError("ctx.start is for def agents; an async agent awaits ctx.call")
        check_timeout("ctx.start", timeout_seconds)
        handle: StepHandle = self._backend.call(tool, args, start=True, timeout=timeout_seconds)
        return handle

    def gather(self, *calls: StepHandle) -> list[Any]:
        """The results of calls started with :meth:`start`, in the order given, once all have
        finished (a failure is raised after every one of them has recorded its outcome)."""
        if self._async:
            raise TypeError("ctx.gather is for def agents; an async agent uses asyncio.gather")
        return self._backend.gather(calls)

    def wait(self, key: str, timeout_seconds: float | None = None) -> Any:
        """Wait for the signal ``key`` (``affidavit signal JOB --key KEY``) and return its
        payload. The job waits without a worker; with ``timeout_seconds``, a job not
        signalled by then continues and the wait returns ``None``. A key is used once per job."""
        args: dict[str, Any] = {"key": key}
        if timeout_seconds is not None:
            args["timeout_seconds"] = timeout_seconds
        return self._backend.wait("wait", key, args, timeout_seconds, start=self._async)

    def approval(
        self,
        key: str,
        payload: Any = None,
        *,
        approvers: list[str] | None = None,
        min_approvals: int | None = None,
    ) -> Any:
        """Ask for an approval (signal ``key``, as an approval node): returns the decision
        (``{"approved": true}``, with the deciding ``comment`` if any); a rejection fails the
        job. ``approvers`` (role names or principal names) and ``min_approvals`` (distinct
        approvals needed) say who decides it, as an approval node's fields do; never the
        job's submitter, and only a principal of role approver or admin.

        Raises:
            ValueError: ``approvers`` or ``min_approvals`` is malformed.
        """
        args: dict[str, Any] = {"key": key}
        if payload is not None:
            args["payload"] = payload
        try:
            ApprovalPolicy.parse(approvers, min_approvals, f"ctx.approval({key!r})")
        except AffidavitError as exc:
            raise ValueError(exc.message) from None
        if approvers is not None:
            args["approvers"] = list(approvers)
        if min_approvals is not None:
            args["min_approvals"] = min_approvals
        return self._backend.wait("approval", key, args, None, start=self._async)

    def sleep(self, seconds: float) -> Any:
        """A durable timer: the job waits ``seconds`` without a worker (none holds it while it
        sleeps) and continues on whichever worker claims it after."""
        return self._backend.sleep(seconds, start=self._async)

    def now(self) -> float:
        """The time (seconds since the epoch), recorded: a recovery gets the same value."""
        import time

        return float(self._backend.value("now", {}, time.time))

    def uuid(self) -> str:
        """A random UUID (text), recorded."""
        import uuid

        return str(self._backend.value("uuid", {}, lambda: str(uuid.uuid4())))

    def random(self) -> float:
        """A random number in [0, 1), recorded."""
        import random

        return float(self._backend.value("random", {}, random.random))

    def emit(self, value: Any) -> None:
        """Append ``value`` (JSON, at most 64 KiB as canonical JSON) to the job's live stream,
        at once: ``affidavit jobs watch`` and ``GET /api/jobs/{id}/stream`` readers see it while
        the job runs, and it is part of the sealed record (a ``stream_emitted`` event). Not a
        step: it returns ``None`` (nothing to await in an async agent). A recovered run does not
        append again a value the record holds: the values of the function are numbered in
        program order, and the first ones the log has are skipped.

        Raises:
            StreamError: the value is not JSON, over 64 KiB, or over the job's stream limit
                (``@affidavit.agent(stream=StreamLimit(...))``); nothing is recorded.
        """
        self._backend.emit(value)

    def start_job(self, agent: Any, input: Any = None, *, queue: str | None = None) -> Any:
        """Start a child job running ``agent`` (an agent or its registered name) with
        ``input``, in ``queue`` (default: the default queue), as one step: the child is
        created once, also across crashes. Returns a handle for :meth:`join`."""
        return self._backend.start_job(agent, input, queue, start=self._async)

    def start_jobs(self, agent: Any, inputs: Iterable[Any], *, queue: str | None = None) -> Any:
        """:meth:`start_job` of ``agent`` for each of ``inputs`` (1 to 1000), as one step each
        (the steps the calls one by one record): the children are created together, in one
        transaction, and their steps recorded in one write. Returns their handles, in order."""
        return self._backend.start_jobs(agent, list(inputs), queue, start=self._async)

    def join(self, handle: Any) -> Any:
        """Wait for a child job (without a worker) and return its
        :class:`~affidavit.ChildResult`: a child's failure or cancellation is data."""
        if self._async:
            return _first(self._backend.join([handle], start=True))
        return self._backend.join([handle], start=False)[0]

    def join_all(self, handles: Iterable[Any]) -> Any:
        """:meth:`join` for several children, as one step: their results in order."""
        return self._backend.join(handles, start=self._async)

    def run_job(self, agent: Any, input: Any = None, *, queue: str | None = None) -> Any:
        """:meth:`start_job` and :meth:`join` (plain ``def`` agents)."""
        if self._async:
            raise TypeError("ctx.run_job is for def agents; an async agent awaits both steps")
        return self.join(self.start_job(agent, input, queue=queue))

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new code path marked ``patch_id``: ``True`` in jobs
        that reach this point with the new code (recorded), ``False`` in a job whose record
        was made by code without the patch here (it keeps the old path)."""
        return self._backend.patched(patch_id)


_CURRENT: ContextVar[AgentContext | None] = ContextVar("affidavit_agent_context", default=None)


@contextmanager
def running(ctx: AgentContext) -> Iterator[None]:
    """Make ``ctx`` what :meth:`AgentContext.current` answers while the agent function runs
    (an ``asyncio.run`` inside copies it to the job's tasks)."""
    token = _CURRENT.set(ctx)
    try:
        yield
    finally:
        _CURRENT.reset(token)


async def _first(results: Any) -> Any:
    return (await results)[0]


def agents_in(items: Iterable[Any]) -> list[Agent]:
    """The :class:`Agent` objects among ``items``."""
    return [i for i in items if isinstance(i, Agent)]
