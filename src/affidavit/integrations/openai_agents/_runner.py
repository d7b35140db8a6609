"""``AffidavitRunner``: the OpenAI Agents SDK's ``Runner.run`` inside an affidavit agent job.

How one run is recorded (the SDK's own loop runs; affidavit swaps what it calls):

1. the starting agent and every agent it hands off to are cloned with their model wrapped, and
   the run's ``RunConfig`` gets a model provider that wraps every model it resolves: each
   ``get_response`` is the pure step ``openai_agents.model_response`` (args: the model, the
   turn, a digest of the conversation), its recorded response returned on a recovery without
   asking the model;
2. every function tool is cloned with its ``on_invoke_tool`` replaced: a call is the tool step
   ``openai_agents.call_tool`` through the ledger (``..._approved`` when its ``needs_approval``
   says so: the runtime's approval gate), or — for a tool made by :func:`ledger_tool` — the
   ``@affidavit.tool`` itself, with its ``reconcile`` hook and policies; an agent's MCP
   servers' tools are wrapped as they are listed, each turn, and their calls carry the step's
   keys in ``_meta``;
3. input and output guardrails (the agents' and the run config's) are cloned to run before the
   model (not beside it, so steps keep their order) as the pure step ``openai_agents.guardrail``;
4. function tool calls of one turn run one at a time, in the order the model asked for them
   (sequence numbers are program order: a recovery must make the calls in the same order);
5. a tool made by ``as_tool`` of an agent registered with ``agent_job`` is a child job per
   call, and a handoff to such an agent is a child job given the conversation
   (:mod:`._children`); a handoff to any other agent runs in the same job: its turns are steps
   of this job.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

from agents import (
    Agent,
    ApplyPatchTool,
    ComputerTool,
    CustomTool,
    FunctionTool,
    GuardrailFunctionOutput,
    Handoff,
    InputGuardrail,
    LocalShellTool,
    Model,
    ModelProvider,
    OutputGuardrail,
    RunConfig,
    Runner,
    RunResult,
    ShellTool,
    ToolExecutionConfig,
)
from agents.function_schema import function_schema
from agents.items import ModelResponse, TResponseStreamEvent
from agents.run_config import DEFAULT_MAX_TURNS
from agents.tool_context import ToolContext as SdkToolContext

import affidavit
from affidavit import AgentContext, Tool, ToolContext
from affidavit.integrations._bridge import close_bridge, open_bridge, record
from affidavit.integrations.openai_agents import _steps
from affidavit.integrations.openai_agents._children import (
    child_tool,
    handed_to_child,
    refuse_server_state,
    refuse_streaming,
    sub_agent_for,
    sub_agent_of,
)
from affidavit.integrations.openai_agents._codec import (
    conversation_digest,
    jsonable,
    load_response,
)

#: The ``_meta`` keys an MCP server's ``tools/call`` carries inside a job (as
#: ``affidavit.integrations.mcp`` sends them): the step's external key, job and step ids.
META_IDEMPOTENCY_KEY, META_JOB_ID, META_STEP_ID = (
    "affidavit/idempotency_key",
    "affidavit/job_id",
    "affidavit/step_id",
)
_STEP: ContextVar[ToolContext | None] = ContextVar("affidavit_openai_agents_step", default=None)
_LOCAL_TOOLS = (ComputerTool, LocalShellTool, ShellTool, ApplyPatchTool, CustomTool)
_GET_RESPONSE = inspect.signature(Model.get_response)


class _Run:
    """One ``AffidavitRunner.run``: its job's context, and the model calls made so far."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.turn = 0
        self.agents: dict[int, Agent[Any]] = {}  # id(original) -> its clone (handoff cycles)
        self.model_override = False  # the RunConfig names the model of every agent
        self.server_state = False  # previous_response_id or conversation_id: the server's
        self.max_turns = DEFAULT_MAX_TURNS


class AffidavitRunner:
    """``await AffidavitRunner.run(agent, input)``: ``agents.Runner.run`` whose every model call
    is a recorded step, every function tool call a tool step through the ledger, every
    guardrail a recorded step — inside an affidavit agent job (an ``async def`` function
    registered with ``@affidavit.agent``). On a recovery recorded steps return their recorded
    results: the model is not asked again for a recorded turn, a committed tool never runs
    again."""

    @classmethod
    async def run(
        cls,
        starting_agent: Agent[Any],
        input: str | list[Any],
        *,
        ctx: AgentContext | None = None,
        run_config: RunConfig | None = None,
        **kwargs: Any,
    ) -> RunResult:
        """Run ``starting_agent`` on ``input`` as ``Runner.run`` does, recorded in the current
        agent job (``ctx``: the job's context, found by default). ``kwargs`` are
        ``Runner.run``'s (``context``, ``max_turns``, ``hooks``, ...).

        Raises:
            affidavit.ConfigError: no agent job is running here; a ``session`` (its history
                lives outside the job's record); an agent with local tools (shell, computer,
                patches), whose calls would not go through the ledger.
        """
        ctx = ctx if ctx is not None else AgentContext.current()
        if ctx is None:
            raise affidavit.ConfigError(
                "AffidavitRunner.run is called outside an affidavit agent job",
                hint="Call it inside an async @affidavit.agent function (or use agents.Runner "
                "for a run that is not recorded).",
            )
        if kwargs.get("session") is not None:
            raise affidavit.ConfigError(
                "AffidavitRunner.run records a run's history in the job: a session is refused",
                hint="Pass the history as the input (a list of items) instead.",
            )
        run = _Run(ctx)
        run.model_override = run_config is not None and run_config.model is not None
        run.server_state = any(kwargs.get(k) for k in ("previous_response_id", "conversation_id"))
        run.max_turns = kwargs.get("max_turns") or DEFAULT_MAX_TURNS
        config = _recorded_config(run_config or RunConfig(), run)
        agent = _wrap_agent(starting_agent, run)
        open_bridge(ctx.job_id)
        try:
            return await Runner.run(agent, input, run_config=config, **kwargs)
        finally:
            close_bridge(ctx.job_id)


def _recorded_config(config: RunConfig, run: _Run) -> RunConfig:
    model = config.model
    execution = config.tool_execution or ToolExecutionConfig()
    return dataclasses.replace(
        config,
        model=_RecordedModel(model, _label(model), run) if isinstance(model, Model) else model,
        model_provider=_RecordedProvider(config.model_provider, run),
        tool_execution=dataclasses.replace(execution, max_function_tool_concurrency=1),
        input_guardrails=[_input_guardrail(g, run) for g in config.input_guardrails or []],
        output_guardrails=[_output_guardrail(g, run) for g in config.output_guardrails or []],
    )


def _wrap_agent(agent: Agent[Any], run: _Run) -> Agent[Any]:
    """A clone of ``agent`` (and of the agents it hands off to) whose calls are recorded."""
    done = run.agents.get(id(agent))
    if done is not None:
        return done
    local = [t for t in agent.tools if isinstance(t, _LOCAL_TOOLS)]
    if local:
        raise affidavit.ConfigError(
            f"agent {agent.name!r} has local tools that would act outside the ledger: "
            f"{[getattr(t, 'name', type(t).__name__) for t in local]}",
            hint="Give the agent function tools (an @affidavit.tool via ledger_tool for "
            "effects that need a reconcile hook).",
        )
    model = agent.model
    clone = agent.clone(
        model=_RecordedModel(model, _label(model), run) if isinstance(model, Model) else model,
        tools=[_wrap_tool(t, run) if isinstance(t, FunctionTool) else t for t in agent.tools],
        input_guardrails=[_input_guardrail(g, run) for g in agent.input_guardrails],
        output_guardrails=[_output_guardrail(g, run) for g in agent.output_guardrails],
        handoffs=[],
    )
    run.agents[id(agent)] = clone
    clone.handoffs = [_wrap_handoff(h, run) for h in agent.handoffs]
    if agent.mcp_servers:
        for server in agent.mcp_servers:
            _pass_keys(server)
        listed = clone.get_mcp_tools

        async def mcp_tools(run_context: Any) -> list[Any]:
            # the servers' tools, listed each turn as the SDK does: each call a ledger step
            # (their names are in the conversation digest: a changed list is caught)
            tools = await listed(run_context)
            return [_wrap_tool(t, run) if isinstance(t, FunctionTool) else t for t in tools]

        clone.get_mcp_tools = mcp_tools  # type: ignore[method-assign]
    return clone


def _wrap_handoff(handoff: Agent[Any] | Handoff[Any, Any], run: _Run) -> Any:
    """A handoff runs in the same job: the agent it hands to is recorded as the first was, or,
    registered with ``agent_job``, its turns are a child job."""
    if isinstance(handoff, Agent):
        return _handed_to(handoff, run)
    original = handoff.on_invoke_handoff

    async def invoke(context: Any, arguments: str) -> Agent[Any]:
        return _handed_to(await original(context, arguments), run)

    return dataclasses.replace(handoff, on_invoke_handoff=invoke)


def _handed_to(agent: Agent[Any], run: _Run) -> Agent[Any]:
    sub = sub_agent_for(agent)
    if sub is None:
        return _wrap_agent(agent, run)
    if run.model_override:  # (it would replace the child job the clone's model is)
        raise affidavit.ConfigError(
            f"a handoff to {agent.name!r}, a child job (agent_job), in a run whose RunConfig "
            "names the model of every agent",
            hint="Give the agents their models instead of RunConfig(model=...).",
        )
    if run.server_state:
        raise refuse_server_state(sub.job.name)
    # (the child's turns are this run's: it is given the turns left, a handoff cycle ends)
    return handed_to_child(agent, sub, run.ctx, lambda: run.max_turns - run.turn)


def _pass_keys(server: Any) -> None:
    """Give an MCP server a ``tool_meta_resolver`` that adds the running step's keys to each
    call's ``_meta`` (after what a resolver it had answers), so a server that deduplicates can:
    outside a step it answers what the server's own resolver does."""
    own = getattr(server, "tool_meta_resolver", None)
    if getattr(own, "affidavit_keys", False):
        return

    async def resolve(context: Any) -> dict[str, Any] | None:
        answer = own(context) if own is not None else None
        if inspect.isawaitable(answer):
            answer = await answer
        step = _STEP.get()
        if step is None:
            return answer
        keys = {
            META_IDEMPOTENCY_KEY: step.external_key,
            META_JOB_ID: step.job_id,
            META_STEP_ID: step.step_id,
        }
        return {**(answer or {}), **keys}

    resolve.affidavit_keys = True  # type: ignore[attr-defined]
    server.tool_meta_resolver = resolve


# --- models -----------------------------------------------------------------------------------


def _label(model: Model | str | None) -> str:
    if isinstance(model, str) or model is None:
        return model or "default"
    name = getattr(model, "model", None)
    return f"{type(model).__name__}:{name}" if isinstance(name, str) else type(model).__name__


class _RecordedProvider(ModelProvider):
    """The run's model provider; every model it resolves is recorded."""

    def __init__(self, inner: ModelProvider, run: _Run) -> None:
        self._inner = inner
        self._run = run

    def get_model(self, model_name: str | None) -> Model:
        return _RecordedModel(self._inner.get_model(model_name), _label(model_name), self._run)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _RecordedModel(Model):
    """A model whose every ``get_response`` is one recorded pure step."""

    def __init__(self, inner: Model, label: str, run: _Run) -> None:
        self._inner = inner
        self._label = label
        self._run = run

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        bound = _GET_RESPONSE.bind(self, *args, **kwargs).arguments
        tool_names = [getattr(t, "name", type(t).__name__) for t in bound.get("tools") or []]
        tool_names += [h.tool_name for h in bound.get("handoffs") or []]
        step_args = {
            "model": self._label,
            "turn": self._run.turn,
            "conversation_sha256": conversation_digest(
                bound.get("system_instructions"), bound.get("input"), tool_names
            ),
        }
        self._run.turn += 1

        def make(step: Any) -> Any:
            return self._inner.get_response(*args, **kwargs)

        recorded = await record(self._run.ctx, _steps.model_response, step_args, make)
        return load_response(recorded)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        refuse_streaming()

    def get_retry_advice(self, request: Any) -> Any:
        return self._inner.get_retry_advice(request)

    async def close(self) -> None:
        await self._inner.close()


# --- tools ------------------------------------------------------------------------------------


class _LedgerInvoker:
    """``on_invoke_tool`` of a :func:`ledger_tool`: the call is the ``@affidavit.tool``'s own
    step in the current job (its ``reconcile`` hook, retries and approvals hold)."""

    def __init__(self, tool: Tool, schema: Any) -> None:
        self.tool = tool
        self._schema = schema

    async def __call__(self, tool_context: SdkToolContext[Any], arguments: str) -> Any:
        ctx = AgentContext.current()
        if ctx is None:
            raise affidavit.ConfigError(
                f"tool {self.tool.name!r} is an @affidavit.tool: it runs only inside an "
                "affidavit agent job (AffidavitRunner.run)"
            )
        try:
            parsed = self._schema.params_pydantic_model.model_validate_json(arguments or "{}")
        except ValueError as exc:  # the model's mistake: told to the model, nothing recorded
            return f"Invalid arguments for tool {self.tool.name}: {exc}"
        args = jsonable(parsed.model_dump())
        answer = ctx.call(self.tool, **args)
        return await answer if inspect.isawaitable(answer) else answer


def ledger_tool(tool: Tool, *, description: str | None = None) -> FunctionTool:
    """An SDK function tool that is the ``@affidavit.tool`` ``tool``: its parameters after the
    ``ToolContext`` are the schema the model sees, and each call inside a job is that tool's own
    step (at most once; its ``reconcile`` hook, retries, limit and approval rule hold).

    Raises:
        affidavit.ConfigError: ``tool`` is not an ``@affidavit.tool``.
    """
    if not isinstance(tool, Tool) or tool.kind != "tool":
        raise affidavit.ConfigError(
            f"ledger_tool takes an @affidavit.tool function, not {tool!r}",
            hint="Decorate the function with @affidavit.tool(name) first.",
        )
    stub = _signature_stub(tool)
    schema = function_schema(stub, name_override=tool.name, description_override=description)
    return FunctionTool(
        name=tool.name,
        description=schema.description or "",
        params_json_schema=schema.params_json_schema,
        on_invoke_tool=_LedgerInvoker(tool, schema),
        strict_json_schema=True,
    )


def _signature_stub(tool: Tool) -> Any:
    """A function with ``tool``'s parameters after its ``ToolContext`` (its schema)."""
    import typing

    fn = tool.fn
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]
    hints = typing.get_type_hints(fn)

    def stub(**kwargs: Any) -> Any:  # pragma: no cover - never called: the schema's source
        raise RuntimeError(tool.name)

    stub.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    stub.__annotations__ = {p.name: hints[p.name] for p in params if p.name in hints}
    stub.__name__ = stub.__qualname__ = getattr(fn, "__name__", tool.name)
    stub.__doc__ = fn.__doc__
    return stub


def _wrap_tool(tool: FunctionTool, run: _Run) -> FunctionTool:
    if isinstance(tool.on_invoke_tool, _LedgerInvoker):
        return tool  # its own step already (and its approval rule is the runtime's)
    original = tool.on_invoke_tool
    needs_approval = tool.needs_approval
    sub = sub_agent_of(tool)
    if sub is not None:  # agent.as_tool of an agent_job: each call a child job
        if run.model_override:  # (the SDK would run the agent on the RunConfig's model)
            raise affidavit.ConfigError(
                f"the agent tool {tool.name!r} of {sub.agent.name!r}, a child job (agent_job), "
                "in a run whose RunConfig names the model of every agent",
                hint="Give the agents their models instead of RunConfig(model=...).",
            )

        async def approve(tool_context: Any, parsed: Any, call_id: str) -> bool:
            return await _asks_approval(needs_approval, tool_context, parsed, call_id)

        invoker = child_tool(tool, sub, run.ctx, approve)
        return dataclasses.replace(
            tool, on_invoke_tool=invoker, needs_approval=False, timeout_seconds=None
        )

    async def invoke(tool_context: SdkToolContext[Any], arguments: str) -> Any:
        try:
            parsed: Any = json.loads(arguments) if arguments else {}
        except ValueError:
            parsed = None
        call: dict[str, Any] = {"tool": tool.name, "call_id": tool_context.tool_call_id}
        if isinstance(parsed, dict):
            call["args"] = jsonable(parsed)
        else:  # not a JSON object: recorded as the model sent it (the tool reports the error)
            call["arguments"] = arguments
        asked = await _asks_approval(needs_approval, tool_context, parsed, call["call_id"])
        step = _steps.call_tool_approved if asked else _steps.call_tool

        async def make(step: ToolContext) -> Any:
            token = _STEP.set(step)  # what an MCP server's call passes in _meta
            try:
                return await original(tool_context, arguments)
            finally:
                _STEP.reset(token)

        recorded = await record(run.ctx, step, call, make)
        if isinstance(recorded, dict) and set(recorded) == {"return"}:
            return recorded["return"]
        return recorded  # a result a person recorded deciding a park

    # No SDK timeout around the step: it would tell the model "timed out" while the step's
    # thread goes on to commit the effect (and a recovery would then answer otherwise).
    return dataclasses.replace(
        tool, on_invoke_tool=invoke, needs_approval=False, timeout_seconds=None
    )


async def _asks_approval(rule: Any, tool_context: Any, parsed: Any, call_id: str) -> bool:
    """Whether a call needs a person's approval: ``needs_approval`` ``True``, or a function
    of the call that does not answer ``False`` (one that raises asks: the safe answer)."""
    if not callable(rule):
        return bool(rule)
    try:
        answer = rule(tool_context, parsed if isinstance(parsed, dict) else {}, call_id)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception:
        return True
    return answer is not False


# --- guardrails -------------------------------------------------------------------------------


def _input_guardrail(guardrail: InputGuardrail[Any], run: _Run) -> InputGuardrail[Any]:
    original = guardrail.guardrail_function
    name = guardrail.get_name()

    async def check(context: Any, agent: Agent[Any], value: Any) -> GuardrailFunctionOutput:
        async def make(step: Any) -> Any:
            answer = original(context, agent, value)
            return await answer if inspect.isawaitable(answer) else answer

        return await _record_guardrail(run, "input", name, agent, value, make)

    return dataclasses.replace(guardrail, guardrail_function=check, run_in_parallel=False)


def _output_guardrail(guardrail: OutputGuardrail[Any], run: _Run) -> OutputGuardrail[Any]:
    original = guardrail.guardrail_function
    name = guardrail.get_name()

    async def check(context: Any, agent: Agent[Any], value: Any) -> GuardrailFunctionOutput:
        async def make(step: Any) -> Any:
            answer = original(context, agent, value)
            return await answer if inspect.isawaitable(answer) else answer

        return await _record_guardrail(run, "output", name, agent, value, make)

    return dataclasses.replace(guardrail, guardrail_function=check)


async def _record_guardrail(
    run: _Run, kind: str, name: str, agent: Agent[Any], value: Any, make: Any
) -> GuardrailFunctionOutput:
    args = {
        "kind": kind,
        "guardrail": name,
        "agent": agent.name,
        "value_sha256": affidavit.canonical_sha256(jsonable(value)),
    }
    recorded = await record(run.ctx, _steps.guardrail, args, make)
    return GuardrailFunctionOutput(
        output_info=recorded.get("output_info"),
        tripwire_triggered=bool(recorded.get("tripwire_triggered")),
    )
