"""``AffidavitDurability``: Pydantic AI's durability capability for affidavit agent jobs.

``Agent(name="support", capabilities=[AffidavitDurability(tools=[...])])`` registers the agent
job ``support``; inside it every model request, tool call and MCP discovery the run makes is a
recorded step (:mod:`._backend`, :mod:`._steps`). How one job runs:

1. the agent function sets the job as the run's durable container and runs the agent with the
   job's input prompt (stable run ids made from the job id: a recovery's run carries the ids
   the first one did); tool calls of one model turn run concurrently, each its own step;
2. a run that ends with deferred tool calls (``requires_approval``, ``ApprovalRequired``,
   ``CallDeferred``) waits: an approval per call (``ctx.approval``, its payload the tool and
   its exact arguments) or a signal carrying the call's result (``ctx.wait``); then the run
   continues with those answers, on whichever worker claims the job;
3. the job's output is ``{"output": <the agent's output as JSON>}``.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from contextlib import suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults
from pydantic_ai import Tool as PydanticTool
from pydantic_ai.agent import AbstractAgent, AgentRunResult, EventStreamHandler
from pydantic_ai.capabilities.abstract import WrapRunHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    DurabilityEngineSpec,
)
from pydantic_ai.messages import AgentStreamEvent
from pydantic_ai.tools import AgentDepsT, RunContext, ToolApproved, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset, FunctionToolset
from pydantic_core import to_jsonable_python

import affidavit
from affidavit import AgentContext, Tool
from affidavit.integrations._bridge import CURRENT_STEP, close_bridge, open_bridge
from affidavit.integrations._children import call_key
from affidavit.integrations.pydantic_ai._backend import AffidavitOperationBackend
from affidavit.integrations.pydantic_ai._delegation import refuse_in_step, run_delegated
from affidavit.integrations.pydantic_ai._steps import AgentSteps

#: The version recorded with each job by default: a change of how steps record is a new format.
RECORD_FORMAT = "affidavit-pydantic-ai/2"
#: How many times one job may stop for deferred tool calls (approvals, external results).
MAX_DEFERRED_ROUNDS = 100
#: The toolset ``tools=`` adds to the agent (its id names nothing persisted).
LEDGER_TOOLSET_ID = "affidavit"
#: The ``_meta`` keys an MCP ``tools/call`` carries inside a job.
META_IDEMPOTENCY_KEY, META_JOB_ID, META_STEP_ID = (
    "affidavit/idempotency_key",
    "affidavit/job_id",
    "affidavit/step_id",
)


@dataclass
class _Shared:
    """What every bound copy of one capability shares (Pydantic AI binds a copy per agent
    and per run): the registered job and steps, and the job whose run is in progress."""

    name: str = ""
    job: Any = None
    steps: AgentSteps | None = None
    agent: AbstractAgent[Any, Any] | None = None
    current: ContextVar[AgentContext | None] = field(
        default_factory=lambda: ContextVar("affidavit_pydantic_ai_job", default=None)
    )


class AffidavitDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent's runs affidavit agent jobs: ``Agent(name="support",
    capabilities=[AffidavitDurability()])`` registers (in the module-level registry, which
    ``--tools`` modules fill) the agent job ``support``, input ``{"prompt": "..."}``, output
    ``{"output": ...}``. Inside the job each model request is a recorded pure step (asked once;
    a recovery returns the recorded response), each tool call a tool step through the
    invocation ledger (at most once), tool calls of one turn run concurrently, MCP servers'
    tool lists are recorded and their calls carry the step's keys in ``_meta``. Outside a job
    the agent runs as it would without the capability (not durable).

    Args:
        tools: ``@affidavit.tool`` functions the model may call besides the agent's own
            tools: each call is that tool's own step (its ``reconcile`` hook, approval rule,
            retries and limit hold). Their parameters after the ``ToolContext`` are the schema.
        name: the agent job's name (default: the agent's ``name``).
        version: the version recorded with each job (default: :data:`RECORD_FORMAT`): a worker
            with another version does not run or recover the job.
        in_flight: what a tool call caught in flight becomes when its tool has no
            ``reconcile`` hook: ``"park"`` (a person decides) or ``"fail"``.
        model_retries: attempts per model request for errors the provider reports.
        model_limit: an ``affidavit.Limit`` on model requests (named ``model:MODEL`` by default).
        budget: the job's ``affidavit.Budget`` (model tokens count each response's usage).
        deps: the ``deps`` every run of the job gets.
        event_stream_handler: Pydantic AI's handler of the run's events: a model request's
            events reach it, and the job's stream (``ctx.emit``), live while its step runs; a
            replayed request sends them to neither.
        stream: the job's stream limit (``affidavit.StreamLimit``).
        queue: the queue the agent's runs go to as child jobs (``await agent.run(...)``
            inside another agent's job; default: the default queue).

    Raises:
        affidavit.ConfigError: a bad option, a name already registered, ``tools=`` that are
            not ``@affidavit.tool`` functions.
        pydantic_ai.exceptions.UserError: the agent has no name (and none is given).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="affidavit",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="agent job",
        codec=JSON_CODEC,  # recorded as JSON in the job's log
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            # the steps run on the job's own event loop: one MCP session per run
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        tool_call_result_upgrade_lenient=False,
        journal_discovery=True,  # the server's tool list is a recorded step
        sequential_tools_in_durable_context=False,  # the ledger orders steps as they start
        unsupported_runtime_toolset_kinds=frozenset({"mcp", "dynamic"}),
        tool_config_key=None,
    )

    def __init__(
        self,
        *,
        tools: Sequence[Tool] = (),
        name: str | None = None,
        version: str | None = None,
        in_flight: str = "park",
        model_retries: int = 3,
        model_limit: affidavit.Limit | None = None,
        budget: affidavit.Budget | None = None,
        deps: Any = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        stream: affidavit.StreamLimit | None = None,
        queue: str | None = None,
    ) -> None:
        super().__init__(event_stream_handler=event_stream_handler, name=name)
        for t in tools:
            if not isinstance(t, Tool) or t.kind != "tool":
                raise affidavit.ConfigError(
                    f"AffidavitDurability: tools= takes @affidavit.tool functions, not {t!r}",
                    hint="Give Pydantic AI tools to the Agent; give @affidavit.tool functions "
                    "(with reconcile hooks) here.",
                )
        if in_flight not in ("park", "fail"):
            raise affidavit.ConfigError(f"in_flight must be 'park' or 'fail', not {in_flight!r}")
        self._ledger_tools = {t.name: t for t in tools}
        self._version = version
        self._in_flight = in_flight
        self._model_retries = model_retries
        self._model_limit = model_limit
        self._budget = budget
        self._deps = deps
        self._stream = stream
        self._queue = queue
        self._shared = _Shared()
        self._backend: AffidavitOperationBackend | None = None
        self._per_run = False
        self._code_module = sys._getframe(1).f_globals.get("__name__")

    # --- Pydantic AI's hooks ------------------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        return self._shared.current.get() is not None

    def get_default_run_id(self) -> str | None:
        ctx = self._shared.current.get()
        return _stable_id(ctx.job_id, 0) if ctx is not None else None

    def get_durable_operation_backend(self) -> AffidavitOperationBackend:
        assert self._backend is not None
        return self._backend

    def _bind_to_agent(self, agent: AbstractAgent[AgentDepsT, Any]) -> None:
        self.register(agent, self.name)
        assert self._shared.steps is not None
        self._backend = AffidavitOperationBackend(
            self._shared.steps, self._shared.current.get, self._ledger_tools
        )
        self._register_toolsets(agent)
        steps = self._shared.steps
        for toolset in agent.toolsets:
            toolset.apply(lambda ts: _pass_keys(ts, steps))
            toolset.apply(lambda ts: _watch_tools(ts, steps, self._ledger_tools))

    def _model_stream_event_handler(self) -> EventStreamHandler[AgentDepsT] | None:
        # (called inside the model request's step, whose coroutine runs in a context of its
        # own: the events go to the job's stream when a step is running them, see _emitted)
        handler = self._event_stream_handler

        async def emitting(ctx: RunContext[AgentDepsT], events: AsyncIterable[Any]) -> None:
            passed = _emitted(events)
            if handler is not None:
                await handler(ctx, passed)
            async for _ in passed:  # (what the handler left)
                pass

        return emitting

    async def _dispatch_event_stream_event(
        self, ctx: RunContext[AgentDepsT], event: AgentStreamEvent
    ) -> None:
        # a tool event reaches the handler from the run itself, on every run of the function
        handler = self._event_stream_handler
        if handler is not None:
            await handler(ctx, self._single_event_stream(event))

    async def wrap_run(
        self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        # a run inside another agent's job (not this agent's own): a child job of that job
        if self.in_durable_context:
            return await super().wrap_run(ctx, handler=handler)
        refuse_in_step(self._shared.name)
        parent = AgentContext.current()
        if parent is not None:
            shared = self._shared
            assert shared.agent is not None
            return await run_delegated(
                parent, self.job, shared.name, shared.agent, ctx, self._queue
            )
        return await super().wrap_run(ctx, handler=handler)

    async def prepare_tools(
        self, ctx: RunContext[AgentDepsT], tool_defs: list[ToolDefinition]
    ) -> list[ToolDefinition]:
        # A tool run outside its step (durable=False) runs alone among its turn's calls: it
        # may start a child job, which waits (on the job's loop) for the calls running before.
        tool_defs = await super().prepare_tools(ctx, tool_defs)
        if not self.in_durable_context:
            return tool_defs
        return [
            dataclasses.replace(t, sequential=True) if t.durable is False else t for t in tool_defs
        ]

    # --- the job ------------------------------------------------------------------------------

    def register(self, agent: AbstractAgent[Any, Any], name: str) -> None:
        """Register the agent job ``name`` and its steps (once per capability: the bound copies
        Pydantic AI makes share them).

        Raises:
            affidavit.ConfigError: the capability is bound to another agent already.
        """
        shared = self._shared
        if shared.job is not None:
            if shared.name != name:
                raise affidavit.ConfigError(
                    f"this AffidavitDurability registers agent {shared.name!r}; it cannot "
                    f"also be {name!r}",
                    hint="Give each agent its own AffidavitDurability().",
                )
            return
        model_limit = self._model_limit
        if model_limit is not None and model_limit.name is None and agent.model is not None:
            model_name = getattr(agent.model, "model_name", str(agent.model))
            model_limit = dataclasses.replace(model_limit, name=f"model:{model_name}")
        shared.steps = AgentSteps(
            name,
            in_flight=self._in_flight,
            model_retries=self._model_retries,
            model_limit=model_limit,
        )
        shared.name, shared.agent = name, agent

        async def run_job(ctx: AgentContext, prompt: str) -> dict[str, Any]:
            return await self._run_job(ctx, prompt)

        run_job.__name__ = run_job.__qualname__ = f"pydantic_ai_{name}"
        if isinstance(self._code_module, str):  # its code_sha256 names the constructing module
            run_job.__module__ = self._code_module
        shared.job = affidavit.agent(
            name,
            version=self._version or RECORD_FORMAT,
            in_flight=self._in_flight,
            budget=self._budget,
            stream=self._stream,
        )(run_job)

    @property
    def job(self) -> Any:
        """The registered agent job (after the capability is bound to an agent)."""
        if self._shared.job is None:
            raise affidavit.ConfigError("AffidavitDurability is not bound to an agent yet")
        return self._shared.job

    @property
    def registrations(self) -> list[Any]:
        """The affidavit objects this capability registered (the agent job, its steps, the
        ``tools=``, a step per function tool the agent has now), e.g. for
        ``Runtime(url, tools=ToolRegistry(durability.registrations))``."""
        shared = self._shared
        if shared.steps is None or shared.agent is None:
            raise affidavit.ConfigError("AffidavitDurability is not bound to an agent yet")
        for tool_name in _function_tool_names(shared.agent):
            if tool_name not in self._ledger_tools:
                shared.steps.function_tool(tool_name)
        return [self.job, *shared.steps.all(), *self._ledger_tools.values()]

    async def _run_job(self, ctx: AgentContext, prompt: str) -> dict[str, Any]:
        if not isinstance(prompt, str):
            raise TypeError(f"the input's prompt must be text, not {type(prompt).__name__}")
        shared = self._shared
        assert shared.agent is not None
        token = shared.current.set(ctx)
        open_bridge(ctx.job_id)
        try:
            output = await self._converse(shared.agent, ctx, prompt)
        except BaseExceptionGroup as group:
            raise _first_control(group) from None
        finally:
            close_bridge(ctx.job_id)
            shared.current.reset(token)
        return {"output": to_jsonable_python(output)}

    def run_options(self) -> dict[str, Any]:
        """Options every run of the job passes: the capability itself when it was not given
        to the agent's constructor (``AffidavitAgent`` wraps an agent built without it)."""
        options: dict[str, Any] = {"capabilities": [self]} if self._per_run else {}
        if self._ledger_tools:  # (a toolset of the run: its tools are the ledger's calls)
            tools = [_schema_tool(t, self._shared.current) for t in self._ledger_tools.values()]
            options["toolsets"] = [FunctionToolset(tools, id=LEDGER_TOOLSET_ID)]
        return options

    async def _converse(
        self, agent: AbstractAgent[Any, Any], ctx: AgentContext, prompt: str
    ) -> Any:
        output_type: Any = agent.output_type
        listed = list(output_type) if isinstance(output_type, list | tuple) else [output_type]
        if DeferredToolRequests not in listed:
            listed.append(DeferredToolRequests)
        options = {"output_type": listed, "deps": self._deps, **self.run_options()}
        result: AgentRunResult[Any] = await agent.run(
            prompt,
            run_id=_stable_id(ctx.job_id, 0),
            conversation_id=_stable_id(ctx.job_id, -1),
            **options,
        )
        for round_no in range(1, MAX_DEFERRED_ROUNDS + 1):
            if not isinstance(result.output, DeferredToolRequests):
                return result.output
            answers = await self._answer(ctx, result.output)
            result = await agent.run(
                message_history=result.all_messages(),
                deferred_tool_results=answers,
                run_id=_stable_id(ctx.job_id, round_no),
                conversation_id=_stable_id(ctx.job_id, -1),
                **options,
            )
        raise RuntimeError(
            f"agent {self._shared.name!r} stopped for deferred tool calls more than "
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
                "agent": self._shared.name,
                "tool": call.tool_name,
                "args": call.args_as_dict(raise_if_invalid=True),
                "tool_call_id": call.tool_call_id,
            }
            await ctx.approval(
                call_key("approve", call.tool_name, call.tool_call_id), payload=payload
            )
            answers.approvals[call.tool_call_id] = ToolApproved()
        for call in requests.calls:
            result = await ctx.wait(call_key("result", call.tool_name, call.tool_call_id))
            answers.calls[call.tool_call_id] = result
        return answers


# --- helpers ----------------------------------------------------------------------------------


def _function_tool_names(agent: AbstractAgent[Any, Any]) -> list[str]:
    names: list[str] = []

    def visit(toolset: AbstractToolset[Any]) -> None:
        if isinstance(toolset, FunctionToolset) and toolset.id != LEDGER_TOOLSET_ID:
            names.extend(toolset.tools)

    for toolset in agent.toolsets:
        toolset.apply(visit)
    return names


def _watch_tools(toolset: AbstractToolset[Any], steps: AgentSteps, ledger: dict[str, Tool]) -> None:
    """Register the step of each function tool of ``toolset`` now, and of each one added to
    it later (``@agent.tool`` after the agent is made): a worker loading the module with
    ``--tools`` knows every step a job of the agent can have recorded before it runs one."""
    if not isinstance(toolset, FunctionToolset) or getattr(toolset.add_tool, "affidavit", False):
        return
    for name in toolset.tools:
        if name not in ledger:
            steps.function_tool(name)
    add = toolset.add_tool

    def add_tool(tool: Any) -> None:
        add(tool)
        if tool.name not in ledger:
            steps.function_tool(tool.name)

    add_tool.affidavit = True  # type: ignore[attr-defined]
    toolset.add_tool = add_tool  # type: ignore[method-assign]


def _pass_keys(toolset: AbstractToolset[Any], steps: AgentSteps) -> None:
    """Register an MCP toolset's steps, and give it a ``process_tool_call`` that adds the
    running step's keys to each call's ``_meta`` (after what a hook it had adds), so a server
    that deduplicates can."""
    if isinstance(toolset, DynamicToolset) and toolset.id is not None:
        steps.toolset_call("dynamic", toolset.id)
        steps.discovery("dynamic", toolset.id, "get_tools")
        return
    try:
        from pydantic_ai.mcp import MCPToolset
    except ImportError:  # pragma: no cover - without fastmcp
        return
    if not isinstance(toolset, MCPToolset):
        return
    if toolset.id is not None:
        steps.toolset_call("mcp", toolset.id)
        steps.discovery("mcp", toolset.id, "get_tools")
        steps.discovery("mcp", toolset.id, "get_instructions")
    if getattr(toolset.process_tool_call, "affidavit_keys", False):
        return
    own = toolset.process_tool_call

    async def process(ctx: RunContext[Any], call_tool: Any, name: str, args: dict[str, Any]) -> Any:
        step = CURRENT_STEP.get()
        if step is None:
            return await (own(ctx, call_tool, name, args) if own else call_tool(name, args))
        keys = {
            META_IDEMPOTENCY_KEY: step.external_key,
            META_JOB_ID: step.job_id,
            META_STEP_ID: step.step_id,
        }

        async def with_keys(
            n: str, a: dict[str, Any], *, metadata: dict[str, Any] | None = None
        ) -> Any:
            return await call_tool(n, a, metadata={**(metadata or {}), **keys})

        if own is None:
            return await with_keys(name, args)
        return await own(ctx, typing.cast(Any, with_keys), name, args)

    process.affidavit_keys = True  # type: ignore[attr-defined]
    toolset.process_tool_call = process


async def _emitted(events: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """The model's stream events, each emitted to the job's stream as it passes
    (``{"pydantic_ai_event": <the event as JSON>}``). An event the stream refuses (over 64 KiB,
    past the job's stream limit) is passed on all the same: the answer is recorded whole."""
    async for event in events:
        step = CURRENT_STEP.get()
        if step is not None:
            with suppress(affidavit.StreamError):
                step.emit({"pydantic_ai_event": to_jsonable_python(event)})
        yield event


def _schema_tool(t: Tool, current: ContextVar[AgentContext | None]) -> PydanticTool[Any]:
    """A Pydantic AI tool with ``t``'s parameters after its ``ToolContext`` (its schema), whose
    call inside a job is ``t``'s own step (``ctx.call``: the ledger, its reconcile hook)."""
    fn = t.fn
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]
    hints = typing.get_type_hints(fn)

    async def call(**kwargs: Any) -> Any:
        ctx = current.get()
        if ctx is None:
            raise affidavit.ConfigError(
                f"@affidavit.tool {t.name!r} runs only inside an affidavit agent job"
            )
        answer = ctx.call(t, **to_jsonable_python(kwargs))
        return await answer if inspect.isawaitable(answer) else answer

    call.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: hints[p.name] for p in params if p.name in hints}
    if "return" in hints:
        call.__annotations__["return"] = hints["return"]
    call.__name__ = call.__qualname__ = getattr(fn, "__name__", t.name)
    call.__doc__ = fn.__doc__
    call.__module__ = getattr(fn, "__module__", __name__)
    # one that may ask for an approval runs alone (the runtime's approval gate quiesces)
    return PydanticTool(call, name=t.name, takes_ctx=False, sequential=bool(t.requires_approval))


def _stable_id(job_id: str, n: int) -> str:
    """A run id fixed by the job (a recovery's run carries the ids the first one did)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"affidavit:{job_id}:pydantic-ai:{n}"))


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
