"""``AffidavitAgent``: a Pydantic AI agent run as an affidavit agent job.

Shaped like Pydantic AI's own durable wrappers (``DBOSAgent``, ``TemporalAgent``): a wrapper
agent that, inside its durable container (here: an affidavit agent job), swaps the agent's model
for one whose ``request`` is a recorded step and its toolsets for one whose ``call_tool`` is a
recorded step. Unlike theirs, a tool call is a *tool step through the invocation ledger* (at most
once; reconciled, parked or failed when caught between its effect and its record), and the
record is affidavit's sealed, verifiable log.

How one job runs (the registered agent function, ``async``):

1. the Pydantic AI run starts under overrides (model, toolsets, sequential tool calls, stable
   run ids derived from the job id);
2. each model request is ``ctx.call(<name>.model_request, ...)``: a pure step whose recorded
   output is the ``ModelResponse`` (``ModelMessagesTypeAdapter`` JSON); on recovery it is returned
   as recorded and the model is not asked; with an ``event_stream_handler`` the step streams,
   its events going to the handler and the job's stream (``ctx.emit``) while it runs;
3. each tool call is ``ctx.call(tool, **args)`` for a tool that is an ``@affidavit.tool`` (its
   ``reconcile`` hook and policies hold) or ``ctx.call(<name>.call_tool, tool=..., args=...,
   call_id=...)`` for any other tool (function tools, MCP servers' tools): the agent's in-flight
   policy applies to those;
4. a run that ends with deferred tool calls (``requires_approval``, ``ApprovalRequired``,
   ``CallDeferred``) waits: an approval per call (``ctx.approval``, its payload the tool and its
   exact arguments) or a signal carrying the call's result (``ctx.wait``); then the run continues
   with those answers, on whichever worker claims the job;
5. the job's output is ``{"output": <the agent's output as JSON>}``.

Steps run on the runtime's step threads; the model's and the toolsets' coroutines run on the
job's own event loop (``asyncio.run_coroutine_threadsafe``), so clients bound to that loop (HTTP
connections, an MCP session) are used from where they were opened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import sys
import threading
import typing
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ModelMessagesTypeAdapter
from pydantic_ai import Tool as PydanticTool
from pydantic_ai.agent import AbstractAgent, AgentRunResult, EventStreamHandler, WrapperAgent
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelAPIError, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, ModelResponseStreamEvent
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.output import OutputDataT
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import AgentDepsT, RunContext, ToolApproved
from pydantic_ai.toolsets import AbstractToolset, CombinedToolset, FunctionToolset, ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import to_jsonable_python

import affidavit
from affidavit import AgentContext, RetryableError, Tool, ToolContext, canonical_sha256

#: Recorded with the agent's version: a change of how this wrapper records steps is a new format.
RECORD_FORMAT = "affidavit-pydantic-ai/1"
#: How many times one job may stop for deferred tool calls (approvals, external results).
MAX_DEFERRED_ROUNDS = 100
_MAX_KEY = 200


@dataclass
class _Pending:
    """A coroutine a step thread is to run on the job's loop (made with the step's context)."""

    make: Callable[[ToolContext], Coroutine[Any, Any, Any]]


@dataclass
class _JobRun:
    """What the wrappers need while one job's Pydantic AI run is in progress."""

    ctx: AgentContext
    loop: asyncio.AbstractEventLoop
    pending: dict[str, _Pending] = field(default_factory=dict)


class AffidavitAgent(WrapperAgent[AgentDepsT, OutputDataT]):
    """A Pydantic AI agent whose runs are affidavit agent jobs.

    ``AffidavitAgent(agent, name="support")`` registers (in the module-level registry, which
    ``--tools`` modules fill) an agent job ``name`` whose input is ``{"prompt": "..."}`` and whose
    output is ``{"output": ...}``, plus the pure step ``<name>.model_request`` and the tool
    ``<name>.call_tool`` its steps are recorded as. Submit it like any agent
    (``affidavit run --agent support --tools FILE --input '{"prompt": "..."}'``,
    ``Runtime.submit("support", {...})``).

    Outside a job the wrapper is the wrapped agent (its runs are not durable).

    Args:
        wrapped: the Pydantic AI agent; it must have a model (not one chosen per run).
        name: the agent's registered name (default: the wrapped agent's ``name``).
        tools: ``@affidavit.tool`` functions the model may call besides the agent's own tools:
            each call is that tool's step (its ``reconcile`` hook, retries and in-flight policy
            hold). Their parameters after the ``ToolContext`` are the tool's schema.
        version: the version recorded with each job (default: :data:`RECORD_FORMAT`, how the
            wrapper records steps): a worker with another version does not run or recover the
            job. Within one version, edited code continues a job whose recorded calls it
            reproduces; a divergent call parks it as ``nondeterministic``. The hash of the
            constructing module's source is recorded for information (``code_sha256``).
        in_flight: what a tool call caught in flight becomes when its tool has no ``reconcile``
            hook: ``"park"`` (a person decides) or ``"fail"``.
        model_retries: attempts per model request for errors the provider reports
            (``ModelAPIError``: rate limits, outages).
        deps: the ``deps`` every run of the agent gets.
        event_stream_handler: Pydantic AI's handler of a run's events (default: the wrapped
            agent's). Inside a job each model request streams, as one recorded step: its events
            go to the handler and to the job's stream (``ctx.emit``) live, while the step runs;
            a replayed request (recovery) sends them to neither. The events of tool calls reach
            the handler from the run itself, on every run of the function.
        stream: the job's stream limit (``affidavit.StreamLimit``; each model event is one
            value): past it, events still reach the handler but no longer the stream.

    Raises:
        affidavit.ConfigError: a bad name or option, or a name already registered.
        pydantic_ai.exceptions.UserError: the wrapped agent has no model.
    """

    def __init__(
        self,
        wrapped: AbstractAgent[AgentDepsT, OutputDataT],
        *,
        name: str | None = None,
        tools: Sequence[Tool] = (),
        version: str | None = None,
        in_flight: str = "park",
        model_retries: int = 3,
        deps: Any = None,
        model_limit: affidavit.Limit | None = None,
        budget: affidavit.Budget | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        stream: affidavit.StreamLimit | None = None,
    ) -> None:
        super().__init__(wrapped)
        from pydantic_ai.exceptions import UserError

        agent_name = name or wrapped.name
        if not agent_name:
            raise UserError(
                "AffidavitAgent needs a name: AffidavitAgent(agent, name='support') "
                "(it names the agent job and its recorded steps)"
            )
        if not isinstance(wrapped.model, Model):
            raise UserError(
                f"AffidavitAgent {agent_name!r}: the wrapped agent needs a model "
                "(Agent(model, ...)); a model chosen per run cannot be recorded"
            )
        for t in tools:
            if not isinstance(t, Tool) or t.kind != "tool":
                raise affidavit.ConfigError(
                    f"AffidavitAgent {agent_name!r}: tools= takes @affidavit.tool functions, "
                    f"not {t!r}",
                    hint="Give Pydantic AI tools to the wrapped Agent; give @affidavit.tool "
                    "functions (with reconcile hooks) here.",
                )
        self._name = agent_name
        self._deps = deps
        self._event_stream_handler = event_stream_handler or wrapped.event_stream_handler
        self._ledger_tools = {t.name: t for t in tools}
        self._current: ContextVar[_JobRun | None] = ContextVar(
            f"affidavit_pydantic_ai_{agent_name}", default=None
        )
        self._runs: dict[str, _JobRun] = {}  # job id -> its run (step threads look it up)
        self._runs_lock = threading.Lock()
        self._model = _RecordedModel(wrapped.model, self)
        constructing = sys._getframe(1).f_globals.get("__name__")

        if model_limit is not None and model_limit.name is None:  # one limit per model name
            model_limit = dataclasses.replace(model_limit, name=f"model:{wrapped.model.model_name}")
        self.model_step = affidavit.pure(
            f"{agent_name}.model_request", version="1", retry=model_retries, limit=model_limit
        )(self._model_step)
        self.tool_step = affidavit.tool(f"{agent_name}.call_tool", in_flight=in_flight)(
            self._tool_step
        )

        async def run_job(ctx: AgentContext, prompt: str) -> dict[str, Any]:
            return await self._run_job(ctx, prompt)

        run_job.__name__ = run_job.__qualname__ = f"pydantic_ai_{agent_name}"
        if isinstance(constructing, str):  # its code_sha256 names the module constructing this
            run_job.__module__ = constructing
        self.job = affidavit.agent(
            agent_name,
            version=version or RECORD_FORMAT,
            in_flight=in_flight,
            budget=budget,
            stream=stream,
        )(run_job)

    @property
    def name(self) -> str | None:
        return self._name

    @name.setter
    def name(self, value: str | None) -> None:  # pragma: no cover - WrapperAgent's contract
        from pydantic_ai.exceptions import UserError

        raise UserError("the name of an AffidavitAgent is fixed: it names its recorded jobs")

    @property
    def registrations(self) -> list[Any]:
        """The affidavit objects this wrapper registered (the agent, its model and tool steps,
        and the ``tools=``), e.g. for ``Runtime(url, tools=ToolRegistry(a.registrations))``."""
        return [self.job, self.model_step, self.tool_step, *self._ledger_tools.values()]

    # --- the job ------------------------------------------------------------------------------

    async def _run_job(self, ctx: AgentContext, prompt: str) -> dict[str, Any]:
        if not isinstance(prompt, str):
            raise TypeError(f"the input's prompt must be text, not {type(prompt).__name__}")
        run = _JobRun(ctx, asyncio.get_running_loop())
        token = self._current.set(run)
        with self._runs_lock:
            self._runs[ctx.job_id] = run
        try:
            with self._overrides():
                output = await self._converse(ctx, prompt)
        except BaseExceptionGroup as group:
            raise _first_control(group) from None
        finally:
            with self._runs_lock:
                self._runs.pop(ctx.job_id, None)
            self._current.reset(token)
        return {"output": to_jsonable_python(output)}

    async def _converse(self, ctx: AgentContext, prompt: str) -> Any:
        output_type: Any = self.wrapped.output_type
        listed = list(output_type) if isinstance(output_type, list | tuple) else [output_type]
        if DeferredToolRequests not in listed:
            listed.append(DeferredToolRequests)
        result: AgentRunResult[Any] = await self.wrapped.run(
            prompt,
            output_type=listed,
            deps=self._deps,
            event_stream_handler=self._event_stream_handler,
            run_id=_stable_id(ctx.job_id, 0),
            conversation_id=_stable_id(ctx.job_id, -1),
        )
        for round_no in range(1, MAX_DEFERRED_ROUNDS + 1):
            if not isinstance(result.output, DeferredToolRequests):
                return result.output
            answers = await self._answer(ctx, result.output)
            result = await self.wrapped.run(
                output_type=listed,
                deps=self._deps,
                message_history=result.all_messages(),
                deferred_tool_results=answers,
                event_stream_handler=self._event_stream_handler,
                run_id=_stable_id(ctx.job_id, round_no),
                conversation_id=_stable_id(ctx.job_id, -1),
            )
        raise RuntimeError(
            f"agent {self._name!r} stopped for deferred tool calls more than "
            f"{MAX_DEFERRED_ROUNDS} times"
        )

    async def _answer(
        self, ctx: AgentContext, requests: DeferredToolRequests
    ) -> DeferredToolResults:
        """Ask a person about each deferred call: an approval per call needing one (its payload
        the tool and its exact arguments; a denial fails the job, as for any affidavit
        approval), a signal carrying the result of each call run elsewhere."""
        answers = DeferredToolResults()
        for call in requests.approvals:
            payload = {
                "agent": self._name,
                "tool": call.tool_name,
                "args": call.args_as_dict(raise_if_invalid=True),
                "tool_call_id": call.tool_call_id,
            }
            await ctx.approval(_key("approve", call.tool_name, call.tool_call_id), payload=payload)
            answers.approvals[call.tool_call_id] = ToolApproved()
        for call in requests.calls:
            result = await ctx.wait(_key("result", call.tool_name, call.tool_call_id))
            answers.calls[call.tool_call_id] = result
        return answers

    @contextmanager
    def _overrides(self) -> Iterator[None]:
        toolsets: list[AbstractToolset[AgentDepsT]] = list(self.wrapped.toolsets)
        if self._ledger_tools:
            toolsets.append(FunctionToolset([_schema_tool(t) for t in self._ledger_tools.values()]))
        recorded = _RecordedToolset(CombinedToolset(toolsets), owner=self)
        with (
            self.wrapped.override(model=self._model, toolsets=[recorded], tools=[]),
            self.wrapped.parallel_tool_call_execution_mode("sequential"),
        ):
            yield

    # --- the bridge: steps run on step threads, the coroutines on the job's loop ---------------

    def _job_run(self) -> _JobRun | None:
        return self._current.get()

    async def _record(self, run: _JobRun, target: Tool, args: dict[str, Any], make: Any) -> Any:
        """``ctx.call(target, **args)`` with ``make`` (a coroutine factory) run by the step."""
        key = canonical_sha256(args)
        run.pending[key] = _Pending(make)
        try:
            return await run.ctx.call(target, **args)
        finally:
            run.pending.pop(key, None)

    def _pending(self, ctx: ToolContext, args: dict[str, Any]) -> tuple[_JobRun, _Pending]:
        with self._runs_lock:
            run = self._runs.get(ctx.job_id)
        found = run.pending.get(canonical_sha256(args)) if run is not None else None
        if run is None or found is None:
            raise RuntimeError(
                f"step {ctx.step_id} of job {ctx.job_id} runs outside the Pydantic AI run "
                f"of agent {self._name!r} that makes it"
            )
        return run, found

    def _model_step(self, ctx: ToolContext, **args: Any) -> Any:
        run, pending = self._pending(ctx, args)
        try:
            response = asyncio.run_coroutine_threadsafe(pending.make(ctx), run.loop).result()
        except ModelAPIError as exc:  # the provider's trouble: worth another attempt
            raise RetryableError(f"{type(exc).__name__}: {exc}") from exc
        tokens = response.usage.input_tokens + response.usage.output_tokens
        if tokens:  # what the job's budget counts (affidavit.Budget model_tokens)
            ctx.report_usage(tokens=tokens)
        return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]

    def _tool_step(self, ctx: ToolContext, tool: str, args: dict[str, Any], call_id: str) -> Any:
        run, pending = self._pending(ctx, {"tool": tool, "args": args, "call_id": call_id})
        try:
            value = asyncio.run_coroutine_threadsafe(pending.make(ctx), run.loop).result()
        except ModelRetry as exc:  # an answer for the model, recorded as the call's outcome
            return {"retry": str(exc.message)}
        except ApprovalRequired as exc:
            return {"deferred": "approval", "metadata": to_jsonable_python(exc.metadata)}
        except CallDeferred as exc:
            return {"deferred": "external", "metadata": to_jsonable_python(exc.metadata)}
        return {"return": to_jsonable_python(value)}


class _RecordedModel(WrapperModel):
    """The wrapped model; inside a job each ``request`` is one recorded pure step."""

    def __init__(self, model: Model, owner: AffidavitAgent[Any, Any]) -> None:
        super().__init__(model)
        self._owner = owner

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        run = self._owner._job_run()
        if run is None:
            return await super().request(messages, model_settings, model_request_parameters)
        args = {
            "model": f"{self.wrapped.system}:{self.wrapped.model_name}",
            "turn": sum(1 for m in messages if isinstance(m, ModelResponse)),
            "messages": len(messages),
            "history_sha256": _history_digest(messages),
        }

        def make(_: ToolContext) -> Coroutine[Any, Any, ModelResponse]:
            return WrapperModel.request(self, messages, model_settings, model_request_parameters)

        recorded = await self._owner._record(run, self._owner.model_step, args, make)
        return _response(recorded)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        run = self._owner._job_run()
        if run is not None:  # one recorded pure step, whose events stream live as it runs
            handler = self._owner._event_stream_handler
            args = {
                "model": f"{self.wrapped.system}:{self.wrapped.model_name}",
                "turn": sum(1 for m in messages if isinstance(m, ModelResponse)),
                "messages": len(messages),
                "history_sha256": _history_digest(messages),
                "stream": True,
            }

            async def make(ctx: ToolContext) -> ModelResponse:
                async with WrapperModel.request_stream(
                    self, messages, model_settings, model_request_parameters, run_context
                ) as streamed:
                    events = _emitted(streamed, ctx)
                    if handler is not None and run_context is not None:
                        await handler(run_context, events)
                    async for _ in events:  # (what the handler left)
                        pass
                return streamed.get()

            recorded = await self._owner._record(run, self._owner.model_step, args, make)
            # the events went out during the step (to the handler and the job's stream): the
            # run's own stream of the recorded response has none, so nothing is seen twice
            yield CompletedStreamedResponse(
                _response(recorded), model_request_parameters=model_request_parameters
            )
            return
        async with super().request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as streamed:
            yield streamed


@dataclass
class _RecordedToolset(WrapperToolset[AgentDepsT]):
    """The agent's toolsets; inside a job each ``call_tool`` is one tool step (ledger)."""

    owner: AffidavitAgent[Any, Any] | None = None

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        owner = self.owner
        run = owner._job_run() if owner is not None else None
        if owner is None or run is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        # recorded as JSON, as a recovery reads them back (validation may have made objects)
        as_json: dict[str, Any] = to_jsonable_python(tool_args)
        own = owner._ledger_tools.get(name)
        if own is not None:  # an @affidavit.tool: its own step, reconcile hook and policies
            return await run.ctx.call(own, **as_json)
        args = {"tool": name, "args": as_json, "call_id": ctx.tool_call_id or ""}

        def make(_: ToolContext) -> Coroutine[Any, Any, Any]:
            return self.wrapped.call_tool(name, tool_args, ctx, tool)

        return _unwrap(await owner._record(run, owner.tool_step, args, make))


# --- helpers ----------------------------------------------------------------------------------


def _response(recorded: Any) -> ModelResponse:
    response = ModelMessagesTypeAdapter.validate_python([recorded])[0]
    if not isinstance(response, ModelResponse):
        raise TypeError(f"step recorded a {type(response).__name__}, not a ModelResponse")
    return response


async def _emitted(
    streamed: AsyncIterable[ModelResponseStreamEvent], ctx: ToolContext
) -> AsyncIterator[ModelResponseStreamEvent]:
    """The model's stream events, each emitted to the job's stream as it passes
    (``{"pydantic_ai_event": <the event as JSON>}``). An event the stream refuses (over 64 KiB,
    past the job's stream limit) is passed on all the same: the model's answer is recorded
    whole in its step."""
    async for event in streamed:
        with suppress(affidavit.StreamError):
            ctx.emit({"pydantic_ai_event": to_jsonable_python(event)})
        yield event


def _unwrap(recorded: Any) -> Any:
    """A ``call_tool`` step's recorded outcome as the tool's answer to Pydantic AI. A value
    without the wrapper's shape (a result a person recorded deciding a park) is the return."""
    if not isinstance(recorded, dict) or len(recorded) > 2:
        return recorded
    if set(recorded) == {"return"}:
        return recorded["return"]
    if set(recorded) == {"retry"}:
        raise ModelRetry(str(recorded["retry"]))
    if set(recorded) == {"deferred", "metadata"} and recorded["deferred"] == "approval":
        raise ApprovalRequired(metadata=recorded["metadata"])
    if set(recorded) == {"deferred", "metadata"} and recorded["deferred"] == "external":
        raise CallDeferred(metadata=recorded["metadata"])
    return recorded


def _schema_tool(t: Tool) -> PydanticTool[Any]:
    """A Pydantic AI tool with ``t``'s parameters after its ``ToolContext`` (its schema); the
    call itself goes through the ledger (``_RecordedToolset``), never through this function."""
    fn = t.fn
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]
    hints = typing.get_type_hints(fn)

    def stub(**kwargs: Any) -> Any:
        raise RuntimeError(f"@affidavit.tool {t.name!r} runs only inside an affidavit job")

    stub.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    stub.__annotations__ = {p.name: hints[p.name] for p in params if p.name in hints}
    if "return" in hints:
        stub.__annotations__["return"] = hints["return"]
    stub.__name__ = stub.__qualname__ = getattr(fn, "__name__", t.name)
    stub.__doc__ = fn.__doc__
    stub.__module__ = getattr(fn, "__module__", __name__)
    return PydanticTool(stub, name=t.name, takes_ctx=False)


def _history_digest(messages: list[ModelMessage]) -> str:
    """SHA-256 of the conversation the model is asked about, without what differs between a
    run and its recovery by construction (times, run ids, generated call ids): a recovery that
    asks about another conversation is caught as nondeterministic."""
    dumped = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    return canonical_sha256(_without_volatile(dumped))


_VOLATILE = frozenset({"timestamp", "run_id", "conversation_id", "tool_call_id"})


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


def _stable_id(job_id: str, n: int) -> str:
    """A run id fixed by the job (a recovery's run carries the ids the first one did)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"affidavit:{job_id}:pydantic-ai:{n}"))


def _key(kind: str, tool_name: str, call_id: str) -> str:
    key = f"{kind}:{tool_name}:{call_id}"
    if len(key) <= _MAX_KEY:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{kind}:{tool_name[:100]}:{digest}"


def _first_control(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception to re-raise from a group a task group raised: the runtime's own (a
    :class:`BaseException` that is not an :class:`Exception`: a park, a wait, a stop) first."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for leaf in leaves:
        if not isinstance(leaf, Exception):
            return leaf
    return leaves[0] if leaves else group
