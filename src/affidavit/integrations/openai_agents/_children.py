"""Agents as tools as child jobs: :func:`agent_job` registers an agent job that runs an SDK
agent with ``AffidavitRunner.run``; inside ``AffidavitRunner.run``, a tool made by that agent's
``as_tool(...)`` is then a child job of the running job instead of one tool step.

1. the child's job: the agent job :func:`agent_job` registered, input ``{"input": TEXT}`` (the
   ``input`` the model gave the tool; other arguments, from ``as_tool(parameters=...)``, as
   their canonical JSON text), output ``{"final_output": ...}``; its model calls, tools and
   guardrails are its own recorded steps, on any worker;
2. in the parent: a ``job`` step (the child created once, also across crashes) and a ``join``
   step (a durable wait: no worker holds the parent while the child runs); a call whose
   ``needs_approval`` asks waits for an approval first (``approve:TOOL:CALL_ID``);
3. what the calling model gets: the child's final output (a ``custom_output_extractor`` of
   ``as_tool`` is not applied: the parent has no ``RunResult`` of the child); a child that
   failed or was cancelled is told to the model by the tool's ``failure_error_function``; only
   a tool made by the registered agent object itself is a child job (not a clone's);
4. a handoff to such an agent: the SDK hands over as always (the handoff call and its output
   are items of the run), then the agent handed to — a clone whose model is the child job —
   takes one turn: the child job, its input ``{"input": [the conversation's items as JSON]}``,
   whose final output is that turn's one assistant message (the text the SDK parses as the
   agent's output type: ``{"response": ...}`` for a type it wraps). The parent's ``RunResult``
   is the SDK's: ``last_agent`` the agent handed to, ``final_output`` the child's,
   ``new_items`` the handoff and that message (the child's own items are in its record). A
   child that failed or was cancelled raises :class:`ChildJobFailed` from
   ``AffidavitRunner.run``. The child's ``max_turns`` is what the parent's run has left (a
   handoff cycle ends); the clone's model is never retried (a retry would be a second child).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from agents import (
    Agent,
    AgentOutputSchema,
    AgentOutputSchemaBase,
    FunctionTool,
    MaxTurnsExceeded,
    Model,
    ModelResponse,
    RunConfig,
    Usage,
)
from agents.items import TResponseStreamEvent
from agents.retry import ModelRetryAdvice, ModelRetryNormalizedError
from agents.tool import resolve_function_tool_failure_error_function
from agents.tool_context import ToolContext as SdkToolContext
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import affidavit
from affidavit import AgentContext, canonical
from affidavit.integrations._children import ChildJobFailed, call_key, check_prompt, run_child

#: ``approve(tool_context, parsed_arguments, call_id)``: whether a call waits for a person.
Approve = Callable[[SdkToolContext[Any], Any, str], Awaitable[bool]]
#: The most a conversation handed to a child job may weigh (canonical JSON).
MAX_HANDOFF_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SubAgentJob:
    """An SDK agent registered as an agent job (:func:`agent_job`)."""

    agent: Agent[Any]
    job: Any
    queue: str | None
    #: what it was registered with (a second ``agent_job`` of the agent must say the same)
    options: tuple[Any, ...] = ()


_LOCK = threading.Lock()
_BY_AGENT_NAME: dict[str, SubAgentJob] = {}


def agent_job(
    agent: Agent[Any],
    *,
    name: str | None = None,
    version: str = "1",
    queue: str | None = None,
    run_config: RunConfig | None = None,
    max_turns: int | None = None,
    budget: affidavit.Budget | None = None,
    in_flight: str = "park",
) -> Any:
    """Register the agent job ``name`` (default: the SDK agent's name) that runs ``agent`` on
    its input with ``AffidavitRunner.run`` (input ``{"input": TEXT}``, output
    ``{"final_output": ...}``). Inside ``AffidavitRunner.run``, each call of a tool made by
    ``agent.as_tool(...)`` then starts this job as a child job (in ``queue``; default: the
    default queue) and waits for it durably. ``budget`` and ``in_flight`` are the child
    job's own (``affidavit.agent``'s): a child's spending counts against its budget, not its
    parent's. Returns the registered agent job.

    Raises:
        affidavit.ConfigError: another agent of the same SDK name is registered already, the
            agent is registered already with other options, or the job's name is taken.
    """
    job_name = name or agent.name
    options = (job_name, version, queue, run_config, max_turns, budget, in_flight)
    with _LOCK:
        known = _BY_AGENT_NAME.get(agent.name)
        if known is not None and known.agent is not agent:
            raise affidavit.ConfigError(
                f"an agent named {agent.name!r} is registered as the job {known.job.name!r} "
                "already: its tools would not say which one they run",
                hint="Give each SDK agent that runs as a child job a name of its own.",
            )
        if known is not None and not _same(known.options, options):
            raise affidavit.ConfigError(
                f"agent {agent.name!r} is registered as the job {known.job.name!r} already, "
                "with other options (name, version, queue, run_config, max_turns, budget or "
                "in_flight)",
                hint="Register each SDK agent with agent_job once.",
            )
        if known is not None:
            return known.job

    registered_turns = max_turns

    async def run_agent(
        ctx: AgentContext, input: str | list[Any], max_turns: int | None = None
    ) -> dict[str, Any]:
        from affidavit.integrations.openai_agents._codec import jsonable
        from affidavit.integrations.openai_agents._runner import AffidavitRunner

        if max_turns is not None and (type(max_turns) is not int or max_turns < 1):
            raise affidavit.ConfigError(f"max_turns must be an integer ≥ 1, not {max_turns!r}")
        turns = [n for n in (registered_turns, max_turns) if n is not None]
        kwargs: dict[str, Any] = {"max_turns": min(turns)} if turns else {}
        result = await AffidavitRunner.run(agent, input, ctx=ctx, run_config=run_config, **kwargs)
        return {"final_output": jsonable(result.final_output)}

    run_agent.__name__ = run_agent.__qualname__ = f"openai_agents_{job_name}"
    module = sys._getframe(1).f_globals.get("__name__")
    if isinstance(module, str):  # its code_sha256 names the registering module
        run_agent.__module__ = module
    job = affidavit.agent(job_name, version=version, budget=budget, in_flight=in_flight)(run_agent)
    with _LOCK:
        _BY_AGENT_NAME[agent.name] = SubAgentJob(agent, job, queue, options)
    return job


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    # (a RunConfig compares by value; one holding objects that do not is compared by identity)
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b, strict=True))


def sub_agent_of(tool: FunctionTool) -> SubAgentJob | None:
    """The registered job of the agent ``tool`` was made from by ``as_tool``, if any: that
    very agent (a clone, or another agent of the same name, is not it: its tool runs in the
    job, as any agent tool)."""
    made_from = getattr(tool, "_agent_instance", None)
    if made_from is None:
        return None
    found = sub_agent_for(made_from)
    return found if found is not None and found.agent is made_from else None


def sub_agent_for(agent: Agent[Any]) -> SubAgentJob | None:
    """The registered job of ``agent`` itself, if any."""
    with _LOCK:
        found = _BY_AGENT_NAME.get(agent.name)
    return found if found is not None and found.agent is agent else None


class _ChildTurns(Model):
    """The model of an agent handed to that runs as a child job: its one answer is the child's
    final output (the child ran the agent's own turns, tools and guardrails). ``turns_left()``:
    the turns the parent's run has left, the child's ``max_turns``."""

    def __init__(self, sub: SubAgentJob, ctx: AgentContext, turns_left: Callable[[], int]) -> None:
        self._sub = sub
        self._ctx = ctx
        self._turns_left = turns_left

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: AgentOutputSchemaBase | None,
        *args: Any,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        **kwargs: Any,
    ) -> ModelResponse:
        from affidavit.integrations.openai_agents._codec import jsonable

        job_name = self._sub.job.name
        if previous_response_id is not None or conversation_id is not None:
            raise refuse_server_state(job_name)
        left = self._turns_left()
        if left < 1:  # (a handoff cycle: each child is given the turns its parent had left)
            raise MaxTurnsExceeded(f"no turn left for the handoff to {job_name!r}")
        items = jsonable([{"role": "user", "content": input}] if isinstance(input, str) else input)
        size = len(canonical(items))
        if size > MAX_HANDOFF_BYTES:
            raise ValueError(
                f"the conversation handed to agent {job_name!r} is {size} bytes as "
                f"JSON; a child job's input is at most {MAX_HANDOFF_BYTES}"
            )
        child = await run_child(
            self._ctx, self._sub.job, job_name, {"input": items, "max_turns": left}, self._sub.queue
        )
        output = child.output
        final = output.get("final_output") if isinstance(output, dict) else output
        message = ResponseOutputMessage(
            id=f"msg_child_{child.job_id}",
            type="message",
            role="assistant",
            status="completed",
            content=[
                ResponseOutputText(
                    type="output_text", text=_answer_text(final, output_schema), annotations=[]
                )
            ],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        refuse_streaming()

    def get_retry_advice(self, request: Any) -> ModelRetryAdvice:
        # a retry would start another child job: an abort is a veto no retry policy lifts
        return ModelRetryAdvice(
            suggested=False,
            replay_safety="unsafe",
            reason="a handoff's child job is not asked twice",
            normalized=ModelRetryNormalizedError(is_abort=True),
        )


def _answer_text(final: Any, schema: AgentOutputSchemaBase | None) -> str:
    """The text the SDK parses as the agent's output: plain text as it is; an output type the
    SDK wraps (``int``, ``list[str]``, a union, ...) as ``{"response": final}``; others (a
    Pydantic model, a dict) as their JSON."""
    if schema is None or schema.is_plain_text():
        return final if isinstance(final, str) else json.dumps(final)
    if isinstance(schema, AgentOutputSchema) and schema._is_wrapped:
        return json.dumps({"response": final})
    return json.dumps(final)


def refuse_streaming() -> NoReturn:
    raise affidavit.ConfigError(
        "streamed model responses are not recorded in affidavit jobs",
        hint="Use AffidavitRunner.run (not Runner.run_streamed) inside a job.",
    )


def refuse_server_state(agent: str) -> affidavit.ConfigError:
    return affidavit.ConfigError(
        f"a handoff to {agent!r}, a child job (agent_job), in a run whose conversation the "
        "server keeps (previous_response_id or conversation_id): the child would not have it",
        hint="Pass the conversation as the input (a list of items) instead.",
    )


def handed_to_child(
    agent: Agent[Any], sub: SubAgentJob, ctx: AgentContext, turns_left: Callable[[], int]
) -> Agent[Any]:
    """What a handoff to ``agent`` (registered with :func:`agent_job`) runs in the parent: a
    clone of it whose one turn is the child job (no tools, handoffs or guardrails of its own:
    the child has them; no model retry: a retry would be a second child)."""
    settings = dataclasses.replace(agent.model_settings, retry=None)
    return agent.clone(
        model=_ChildTurns(sub, ctx, turns_left),
        model_settings=settings,
        tools=[],
        handoffs=[],
        mcp_servers=[],
        input_guardrails=[],
        output_guardrails=[],
    )


def child_tool(tool: FunctionTool, sub: SubAgentJob, ctx: AgentContext, approve: Approve) -> Any:
    """``on_invoke_tool`` of the agent tool ``tool``: each call a child job of ``ctx``'s job
    (``approve(tool_context, parsed, call_id)``: whether a person approves it first). A child
    that failed or was cancelled is told to the model by the tool's ``failure_error_function``
    (``as_tool``'s; raised when it is ``None``)."""
    job_name = sub.job.name

    async def invoke(tool_context: SdkToolContext[Any], arguments: str) -> Any:
        try:
            parsed: Any = json.loads(arguments) if arguments else {}
        except ValueError as exc:  # the model's mistake: told to the model, nothing recorded
            return f"Invalid JSON input for tool {tool.name}: {exc}"
        text = _input_text(parsed)
        try:
            check_prompt(job_name, text)
        except ValueError as exc:
            return f"Invalid input for tool {tool.name}: {exc}"
        call_id = tool_context.tool_call_id
        if await approve(tool_context, parsed, call_id):
            payload = {"tool": tool.name, "args": parsed, "call_id": call_id, "agent": job_name}
            await ctx.approval(call_key("approve", tool.name, call_id), payload=payload)
        try:
            child = await run_child(ctx, sub.job, job_name, {"input": text}, sub.queue)
        except ChildJobFailed as exc:  # (recorded: a recovery answers the model the same)
            told = resolve_function_tool_failure_error_function(tool, tool_context)
            if told is None:
                raise
            answer = told(tool_context, exc)
            return await answer if inspect.isawaitable(answer) else answer
        output = child.output
        return output.get("final_output") if isinstance(output, dict) else output

    return invoke


def _input_text(parsed: Any) -> str:
    if isinstance(parsed, dict) and set(parsed) == {"input"} and isinstance(parsed["input"], str):
        return parsed["input"]
    return canonical(parsed).decode()
