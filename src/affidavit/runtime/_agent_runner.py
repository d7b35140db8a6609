"""Runs agent jobs: calls the agent function and turns each recording ``ctx`` call into one
step of the step executor, numbered in program order.

A run always calls the function from the top. A call whose sequence number is recorded
returns its recorded result without executing (a committed tool never runs again, a finished
pure step never re-runs) — after its kind, tool and argument hash are checked against the
record: code that diverges parks the job as ``nondeterministic``. The first unrecorded call
continues the job. Calls started together (``ctx.start``, ``asyncio.gather``) take their
sequence numbers in the order the program started them, and their ``step_called`` events are
written in that order before they run.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from affidavit.core import crash
from affidavit.core.agent_steps import (
    NODE_TYPE_OF_KIND,
    agent_node_id,
    agent_step_id,
    call_signature,
)
from affidavit.core.canonical import canonical, parse
from affidavit.core.errors import AffidavitError, CancelRequestedError, FencedError, StoreError
from affidavit.record import ReplayContext
from affidavit.runtime._agent import Agent, AgentContext, running
from affidavit.runtime._agent_waits import check_sleep, check_wait, rfc3339, wait_extra, wait_step
from affidavit.runtime._budget import BudgetMeter
from affidavit.runtime._cancel import end_cancelled
from affidavit.runtime._children import join_children, start_child, start_children
from affidavit.runtime._recovery import Recovery
from affidavit.runtime._run_base import Claim, Item, StepFailed, Stop, error_dict, log
from affidavit.runtime._sdk import Tool
from affidavit.runtime._step_executor import StepSpec
from affidavit.store import StoredEvent

if TYPE_CHECKING:
    from affidavit.runtime._runner import JobRunner, RunParts


class AgentInterrupt(BaseException):
    """Ends an agent function's run from inside a ``ctx`` call: the job waits, parks, fails
    (a step failed for good) or the run must stop. A :class:`BaseException`, so that the
    agent's own ``except Exception`` does not swallow it."""

    def __init__(self, cause: Stop | StepFailed | StoreError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def run_agent_job(
    runner: JobRunner,
    claim: Claim,
    events: list[StoredEvent],
    replay: ReplayContext,
    started: dict[str, Any],
) -> str:
    """Run the agent job of ``claim`` (its log ``events``, its ``agent_started`` payload
    ``started``); the resulting status as :meth:`JobRunner.run` returns it."""
    name = str(started["agent"])
    agent = runner.tools.get_agent(name)
    refused = f"agent {name!r}" if agent is None else agent.refusal(started["agent_version"])
    if agent is None or refused is not None:
        runner.missing_tools = [str(refused)]
        return "unrunnable"
    missing = sorted(
        {
            f"{p['kind']} {p['tool_name']!r}"
            for p in replay.agent_steps.values()
            if p["kind"] in ("tool", "pure")
            and (
                (found := runner.tools.get(str(p["tool_name"]))) is None or found.kind != p["kind"]
            )
        }
    )
    if missing:
        runner.missing_tools = missing
        return "unrunnable"
    kinds = {agent_node_id(s): str(p["kind"]) for s, p in replay.agent_steps.items()}
    parts = runner.run_parts(
        claim,
        events,
        replay,
        dict(replay.policy or agent.policy()),
        lambda node_id: NODE_TYPE_OF_KIND.get(kinds.get(node_id, "pure"), "pure"),
    )
    run = AgentRun(parts, agent, replay, kinds)
    run.budget = BudgetMeter.of_log(events, started)
    if run.budget is not None:
        parts.executor.on_usage = run.budget.used
    try:
        if claim.recovered:
            run.count_recovery(events, runner.max_recoveries)
        return run.execute()
    except FencedError:
        return "lost"
    except CancelRequestedError:  # the store started nothing new: the job ends cancelled
        return end_cancelled(parts.journal)
    except Stop as stop:
        return stop.status


class AgentRun:
    """One run of one agent job; the backend of the :class:`AgentContext` it gives the
    function, and the :class:`~affidavit.runtime._recovery.StepSource` of its recorded steps."""

    def __init__(
        self, parts: RunParts, agent: Agent, replay: ReplayContext, kinds: dict[str, str]
    ) -> None:
        self.parts = parts
        self.agent = agent
        self.replay = replay
        self.journal = parts.journal
        self.executor = parts.executor
        self.control = parts.control
        self.job_id = parts.journal.job_id
        self.input = replay.input
        self._kinds = kinds  # node id -> kind, recorded or called in this run
        self._called: dict[str, dict[str, Any]] = {}  # node id -> step_called of this run
        self._seq = 0
        self._lock = threading.Lock()  # sequence numbers
        self._pool: ThreadPoolExecutor | None = None
        self._outstanding: set[Future[Any]] = set()
        self._interrupt: AgentInterrupt | None = None
        self._keys: set[str] = set()  # wait keys used in this run
        self.budget: BudgetMeter | None = None  # the job's budget (runtime/_budget.py)
        self.recovery = Recovery(
            parts.journal, parts.executor, self, replay, parts.tools, parts.policy, parts.metrics
        )

    # --- StepSource ---------------------------------------------------------------------------

    def step_order(self) -> Sequence[str]:
        return [agent_node_id(seq) for seq in sorted(self.replay.agent_steps)]

    def _called_payload(self, node_id: str) -> dict[str, Any]:
        found = self._called.get(node_id)
        if found is None:
            found = self.replay.agent_steps[int(node_id[1:])]
        return found

    def spec(self, node_id: str) -> StepSpec:
        p = self._called_payload(node_id)
        tool = p.get("tool_name")
        return StepSpec(node_id, str(p["step_id"]), str(p["kind"]), tool if tool else None)

    def step_args(self, node_id: str) -> dict[str, Any]:
        args = self._called_payload(node_id).get("args")
        if not isinstance(args, dict):
            raise StepFailed(node_id, {"type": "args", "message": "recorded args unreadable"})
        return args

    # --- the run ------------------------------------------------------------------------------

    def count_recovery(self, events: list[StoredEvent], limit: int) -> None:
        pending = [s["node_id"] for s in self.replay.pending_tool_invocations.values()]
        order = self.step_order()
        self.recovery.count_recovery(
            events, limit, next(iter(pending), None), order[-1] if order else None
        )

    def execute(self) -> str:
        """Run the function until the job completes, fails, waits or parks."""
        if self.recovery.fail_recorded():
            return "failed"
        self.recovery.confirm_recorded(self.replay.completed_nodes)
        ctx = AgentContext(self, is_async=self.agent.is_async)
        kwargs = self.input if isinstance(self.input, dict) else {}
        try:
            try:
                with running(ctx):
                    if self.agent.is_async:
                        output = asyncio.run(self._main(ctx, kwargs))
                    else:
                        output = self.agent.fn(ctx, **kwargs)
            finally:
                self._drain()
            if self._interrupt is not None:  # the function caught it: it still ends the run
                raise self._interrupt
        except AgentInterrupt as interrupt:
            return self._interrupted_status(interrupt)
        except Exception as exc:
            self._drain()
            if self._interrupt is not None:
                return self._interrupted_status(self._interrupt)
            error = {**error_dict(exc), "type": "agent_error"}
            error["exception"] = type(exc).__name__
            log.info("job %s: agent %r raised %s", self.job_id, self.agent.name, error)
            self.journal.fail_job(None, error)
            return "failed"
        recorded = len(self.replay.agent_steps)
        if self._seq < recorded:
            seq = self._seq
            raise self._park_diverged(
                seq,
                self.replay.agent_steps[seq],
                None,
                f"the agent returned after {seq} calls, but the job's record has {recorded}: "
                f"call {seq} was recorded and is no longer made",
            )
        try:
            canonical(output)
        except AffidavitError as exc:
            self.journal.fail_job(
                None,
                {
                    "type": "agent_output",
                    "message": f"agent {self.agent.name!r} returned a value that cannot be "
                    f"recorded: {exc.message}",
                },
            )
            return "failed"
        crash.crash_point("job.before_complete")
        self.journal.complete(output)
        return "completed"

    async def _main(self, ctx: AgentContext, kwargs: dict[str, Any]) -> Any:
        return await self.agent.fn(ctx, **kwargs)

    def _interrupted_status(self, interrupt: AgentInterrupt) -> str:
        cause = interrupt.cause
        if isinstance(cause, StepFailed):
            self.journal.fail_job(cause.node_id, cause.error)
            return "failed"
        if isinstance(cause, StoreError):  # the run ends as a plan run's would: with the error
            raise cause  # (a cancel request's refusal included: see run_agent_job)
        return cause.status

    def end(self, exc: Stop | StepFailed | StoreError) -> AgentInterrupt:
        """What a failed write or step inside a ``ctx`` call does to the run: a write fenced
        off ends it as ``lost``; anything else as itself (never an exception the agent's own
        code could catch and carry on after)."""
        if isinstance(exc, FencedError):
            return self.interrupted(Stop("lost"))
        return self.interrupted(exc)

    def interrupted(self, cause: Stop | StepFailed | StoreError) -> AgentInterrupt:
        """Record what ends the run (the first cause wins, a step's own outcome over a
        worker's stop) and tell the steps still running to start no new try."""
        with self._lock:
            current = self._interrupt
            released = (
                current is not None
                and isinstance(current.cause, Stop)
                and current.cause.status == "released"
            )
            if current is None or (
                released and not (isinstance(cause, Stop) and cause.status == "released")
            ):
                current = self._interrupt = AgentInterrupt(cause)
            self.control.ending.set()
            return current

    def _drain(self) -> None:
        """Wait for every call still running: each records its outcome before the run ends."""
        while self._outstanding:
            wait_futures(list(self._outstanding))
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # --- sequence numbers ---------------------------------------------------------------------

    def next_step(
        self, kind: str, tool_name: str | None, args: dict[str, Any]
    ) -> tuple[StepSpec, bytes, Item | None]:
        """Take the next sequence number for a call: its spec, its args' canonical bytes and
        its ``step_called`` event (``None`` when recorded already — then it matches the
        record, or the job parks as ``nondeterministic``)."""
        if self._interrupt is not None:
            raise self._interrupt
        try:
            args_jcs = canonical(args)
        except AffidavitError as exc:
            raise AgentInterrupt(
                StepFailed(
                    agent_node_id(self._seq),
                    {
                        "type": exc.code,
                        "message": f"the args of {kind} call {self._seq} cannot be recorded: "
                        f"{exc.message}",
                    },
                )
            ) from exc
        with self._lock:
            seq = self._seq
            self._seq += 1
        step = agent_step_id(self.job_id, seq, kind)
        cipher = self.executor.cipher
        if cipher is not None:  # a subject's job: the args are recorded, hashed, keyed sealed
            args_jcs = canonical(cipher.seal(parse(args_jcs)))
        hashed = hashlib.sha256(args_jcs).hexdigest()[:16]
        node_id = agent_node_id(seq)
        recorded = self.replay.agent_steps.get(seq)
        called = {"kind": kind, "tool_name": tool_name, "args_hash": hashed}
        if recorded is not None:
            if call_signature(recorded) != called:
                raise self._park_diverged(seq, recorded, called, None)
            self._kinds[node_id] = kind
            spec = StepSpec(node_id, str(recorded["step_id"]), kind, tool_name)
            return spec, args_jcs, None
        payload = {
            "seq": seq,
            "node_id": node_id,
            "step_id": step,
            "kind": kind,
            "tool_name": tool_name,
            "args": orjson.Fragment(args_jcs),
            "args_hash": hashed,
        } | ({} if self.agent.code_sha256 is None else {"code_sha256": self.agent.code_sha256})
        self._kinds[node_id] = kind
        self._called[node_id] = {**payload, "args": args}
        return StepSpec(node_id, step, kind, tool_name), args_jcs, ("step_called", payload)

    def plain(self, called: Item) -> Item:
        """A ``step_called`` event with its args as a plain object, for a write whose payloads
        are canonicalized in full (its args are held as canonical bytes for the fast path)."""
        event_type, payload = called
        return event_type, {**payload, "args": self._called[payload["node_id"]]["args"]}

    def _park_diverged(
        self,
        seq: int,
        recorded: dict[str, Any],
        called: dict[str, Any] | None,
        message: str | None,
    ) -> AgentInterrupt:
        was = call_signature(recorded)
        if message is None:
            message = (
                f"call {seq} of agent {self.agent.name!r} is {called}, but the job recorded "
                f"{was} there: the code diverged from the record"
            )
        try:
            stop = self.journal.park(
                "nondeterministic",
                node_id=agent_node_id(seq),
                step_id=str(recorded["step_id"]),
                detail={"seq": seq, "recorded": was, "called": called, "message": message},
            )
        except (Stop, StoreError) as exc:  # (a lost lease while parking)
            return self.end(exc)
        return self.interrupted(stop)

    # --- the AgentContext backend -------------------------------------------------------------

    def _tool(self, target: Tool | str) -> Tool:
        name = target.name if isinstance(target, Tool) else target
        if not isinstance(name, str):
            raise TypeError(f"ctx.call takes a @tool/@pure function or its name, not {target!r}")
        found = self.parts.tools.get(name)
        if found is None or (isinstance(target, Tool) and found.fn is not target.fn):
            raise AgentInterrupt(
                StepFailed(
                    agent_node_id(self._seq),
                    {
                        "type": "tool_not_registered",
                        "message": f"agent {self.agent.name!r} calls {name!r}, which is not "
                        "registered in this worker",
                    },
                )
            )
        return found

    def call(
        self, target: Tool | str, args: dict[str, Any], *, start: bool, timeout: float | None
    ) -> Any:
        t = self._tool(target)
        if t.requires_approval:  # it may ask for an approval, which ends the run as a wait does:
            self.quiesce()  # the calls still running record their outcome first, and it runs alone
        spec, args_jcs, called = self.next_step(t.kind, t.name, args)
        if timeout is not None:
            spec = replace(spec, timeout_seconds=timeout)
        if called is not None and self.budget is not None:
            self._within_budget(t)
        if not start or t.requires_approval:
            value = self._run_step(spec, args, args_jcs, (called,) if called else ())
            return value if not start else _finished(value, self.agent.is_async)
        if called is not None:
            # written now, in program order, so that the log numbers calls as they started
            self.write_or_interrupt(called)
        future = self._submit(lambda: self._run_step(spec, args, args_jcs, ()))
        if self.agent.is_async:
            return asyncio.wrap_future(future)
        return future

    def _within_budget(self, t: Tool) -> None:
        """Before a new call: count it, or park the job (``budget_exceeded``) without it."""
        assert self.budget is not None
        reason = self.budget.admit()
        if reason is None:
            return
        detail = self.budget.detail(reason, t.kind, t.name)
        self.quiesce()  # the calls still running record their outcome first
        try:
            stop = self.journal.park("budget_exceeded", node_id=None, step_id=None, detail=detail)
        except (Stop, StoreError) as exc:
            raise self.end(exc) from None
        raise self.interrupted(stop)

    def write_or_interrupt(self, *items: Item) -> None:
        try:
            self.journal.write(*items, fast=True)
        except (Stop, StoreError) as exc:
            raise self.end(exc) from None

    def _submit(self, fn: Callable[[], Any]) -> Future[Any]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.agent.max_concurrency, thread_name_prefix="affidavit-agent"
            )
        future = self._pool.submit(fn)
        self._outstanding.add(future)
        future.add_done_callback(self._outstanding.discard)
        return future

    def _run_step(
        self, spec: StepSpec, args: dict[str, Any], args_jcs: bytes, prelude: tuple[Item, ...]
    ) -> Any:
        if spec.node_id in self.replay.completed_nodes:
            crash.crash_point("agent.replay_step")
            return self.replay.node_output(spec.node_id)
        try:
            self.control.check_stopping()
            self.control.check_lease()
            if spec.kind == "tool":
                return self.executor.run_tool(spec, args, args_jcs, prelude=prelude)
            return self.executor.run_pure(spec, args, prelude=prelude)
        except (Stop, StepFailed, StoreError) as exc:
            raise self.end(exc) from None

    def gather(self, handles: Iterable[Any]) -> list[Any]:
        listed = list(handles)
        for h in listed:
            if not isinstance(h, Future):
                raise TypeError(f"ctx.gather takes handles from ctx.start, not {h!r}")
        wait_futures(listed)
        return [h.result() for h in listed]

    def _settled(self, fn: Callable[[], Any], start: bool) -> Any:
        """``fn()`` now; in an async agent, as a finished awaitable."""
        if not start:
            return fn()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(fn())
        return future

    def wait(
        self, kind: str, key: str, args: dict[str, Any], timeout: float | None, *, start: bool
    ) -> Any:
        return self._settled(lambda: self._wait(kind, key, args, timeout), start)

    def _wait(self, kind: str, key: str, args: dict[str, Any], timeout: float | None) -> Any:
        check_wait(key, timeout)
        self.quiesce()
        spec, _, called = self.next_step(kind, None, args)
        recorded_wait = self.replay.waits.get(key)
        if key in self._keys or (
            recorded_wait is not None and recorded_wait.get("node_id") != spec.node_id
        ):
            raise ValueError(f"the wait key {key!r} is used twice in job {self.job_id}")
        self._keys.add(key)
        extra, wake_at = wait_extra(kind, args, timeout)
        return wait_step(
            self, spec, key, "approval" if kind == "approval" else "signal", extra, wake_at, called
        )

    def sleep(self, seconds: float, *, start: bool) -> Any:
        return self._settled(lambda: self._sleep(seconds), start)

    def _sleep(self, seconds: float) -> None:
        check_sleep(seconds)
        self.quiesce()
        spec, _, called = self.next_step("sleep", None, {"seconds": seconds})
        wake_at = time.time() + float(seconds)
        key = f"{self.job_id}:{spec.node_id}"
        wait_step(self, spec, key, "timer", {"wake_at": rfc3339(wake_at)}, wake_at, called)

    def quiesce(self) -> None:
        """Before a wait: let every call still running record its outcome (a wait may end the
        run, and must not cut a running step off)."""
        self._drain_outstanding()
        if self._interrupt is not None:
            raise self._interrupt

    def _drain_outstanding(self) -> None:
        while self._outstanding:
            wait_futures(list(self._outstanding))

    def value(self, kind: str, args: dict[str, Any], make: Callable[[], Any]) -> Any:
        spec, _, called = self.next_step(kind, None, args)
        if spec.node_id in self.replay.completed_nodes:
            crash.crash_point("agent.replay_step")
            return self.replay.node_output(spec.node_id)
        value = make()
        finished = {
            "node_id": spec.node_id,
            "step_id": spec.step_id,
            "attempt": 1,
            "result_type": "pure",
            "output": value,
            "duration_ms": 0,
        }
        items: list[Item] = [self.plain(called)] if called else []
        try:
            self.journal.write(*items, ("node_finished", finished))
        except (Stop, StoreError) as exc:
            raise self.end(exc) from None
        return value

    def emit(self, value: Any) -> None:
        if self._interrupt is not None:
            raise self._interrupt
        try:
            self.executor.stream.emit(value)
        except (Stop, StoreError) as exc:  # (a StreamError, the agent's to handle, passes)
            raise self.end(exc) from None

    def start_job(self, target: Any, job_input: Any, queue: str | None, *, start: bool) -> Any:
        return self._settled(lambda: start_child(self, target, job_input, queue), start)

    def start_jobs(self, target: Any, inputs: list[Any], queue: str | None, *, start: bool) -> Any:
        return self._settled(lambda: start_children(self, target, inputs, queue), start)

    def join(self, handles: Iterable[Any], *, start: bool) -> Any:
        return self._settled(lambda: join_children(self, list(handles)), start)

    def patched(self, patch_id: str) -> bool:
        if not isinstance(patch_id, str) or not patch_id:
            raise ValueError("ctx.patched takes a non-empty text id")
        if self._interrupt is not None:
            raise self._interrupt
        recorded = self.replay.agent_steps.get(self._seq)
        if recorded is not None and not (
            recorded["kind"] == "patched" and recorded.get("args") == {"id": patch_id}
        ):
            return False  # recorded by code without this patch here: keep the old path
        return bool(self.value("patched", {"id": patch_id}, lambda: True))


def _finished(value: Any, is_async: bool) -> Any:
    """``value`` as the handle ``ctx.start`` (or an async agent's ``ctx.call``) returns."""
    done: Future[Any] = Future()
    done.set_result(value)
    return asyncio.wrap_future(done) if is_async else done
