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
   failed or was cancelled is told to the model as the SDK's default tool error;
4. a handoff to such an agent: the SDK hands over as always (the handoff call and its output
   are items of the run), then the agent handed to — a clone whose model is the child job —
   takes one turn: the child job, its input ``{"input": [the conversation's items as JSON]}``,
   whose final output is that turn's one assistant message. The parent's ``RunResult`` is the
   SDK's: ``last_agent`` the agent handed to, ``final_output`` the child's (parsed as the
   agent's output type by the SDK), ``new_items`` the handoff and that message (the child's own
   items are in its record). A child that failed or was cancelled raises
   :class:`ChildJobFailed` from ``AffidavitRunner.run``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    Model,
    ModelResponse,
    RunConfig,
    Usage,
    default_tool_error_function,
)
from agents.items import TResponseStreamEvent
from agents.tool import ToolOriginType, get_function_tool_origin
from agents.tool_context import ToolContext as SdkToolContext
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import affidavit
from affidavit import AgentContext, canonical
from affidavit.integrations._children import ChildJobFailed, check_prompt, run_child

_MAX_KEY = 200
#: The most a conversation handed to a child job may weigh (canonical JSON).
MAX_HANDOFF_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SubAgentJob:
    """An SDK agent registered as an agent job (:func:`agent_job`)."""

    agent: Agent[Any]
    job: Any
    queue: str | None


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
) -> Any:
    """Register the agent job ``name`` (default: the SDK agent's name) that runs ``agent`` on
    its input with ``AffidavitRunner.run`` (input ``{"input": TEXT}``, output
    ``{"final_output": ...}``). Inside ``AffidavitRunner.run``, each call of a tool made by
    ``agent.as_tool(...)`` then starts this job as a child job (in ``queue``; default: the
    default queue) and waits for it durably. Returns the registered agent job.

    Raises:
        affidavit.ConfigError: another agent of the same SDK name is registered already, or
            the job's name is taken.
    """
    job_name = name or agent.name
    with _LOCK:
        known = _BY_AGENT_NAME.get(agent.name)
        if known is not None and known.agent is not agent:
            raise affidavit.ConfigError(
                f"an agent named {agent.name!r} is registered as the job {known.job.name!r} "
                "already: its tools would not say which one they run",
                hint="Give each SDK agent that runs as a child job a name of its own.",
            )
        if known is not None:
            return known.job

    async def run_agent(ctx: AgentContext, input: str | list[Any]) -> dict[str, Any]:
        from affidavit.integrations.openai_agents._codec import jsonable
        from affidavit.integrations.openai_agents._runner import AffidavitRunner

        options: dict[str, Any] = {} if max_turns is None else {"max_turns": max_turns}
        result = await AffidavitRunner.run(agent, input, ctx=ctx, run_config=run_config, **options)
        return {"final_output": jsonable(result.final_output)}

    run_agent.__name__ = run_agent.__qualname__ = f"openai_agents_{job_name}"
    module = sys._getframe(1).f_globals.get("__name__")
    if isinstance(module, str):  # its code_sha256 names the registering module
        run_agent.__module__ = module
    job = affidavit.agent(job_name, version=version)(run_agent)
    with _LOCK:
        _BY_AGENT_NAME[agent.name] = SubAgentJob(agent, job, queue)
    return job


def sub_agent_of(tool: FunctionTool) -> SubAgentJob | None:
    """The registered job of the agent ``tool`` was made from by ``as_tool``, if any."""
    origin = get_function_tool_origin(tool)
    if origin is None or origin.type != ToolOriginType.AGENT_AS_TOOL or not origin.agent_name:
        return None
    with _LOCK:
        return _BY_AGENT_NAME.get(origin.agent_name)


def sub_agent_for(agent: Agent[Any]) -> SubAgentJob | None:
    """The registered job of ``agent`` itself, if any."""
    with _LOCK:
        found = _BY_AGENT_NAME.get(agent.name)
    return found if found is not None and found.agent is agent else None


class _ChildTurns(Model):
    """The model of an agent handed to that runs as a child job: its one answer is the child's
    final output (the child ran the agent's own turns, tools and guardrails)."""

    def __init__(self, sub: SubAgentJob, ctx: AgentContext) -> None:
        self._sub = sub
        self._ctx = ctx

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        from affidavit.integrations.openai_agents._codec import jsonable

        items = jsonable([{"role": "user", "content": input}] if isinstance(input, str) else input)
        size = len(canonical(items))
        if size > MAX_HANDOFF_BYTES:
            raise ValueError(
                f"the conversation handed to agent {self._sub.job.name!r} is {size} bytes as "
                f"JSON; a child job's input is at most {MAX_HANDOFF_BYTES}"
            )
        job_name = self._sub.job.name
        child = await run_child(
            self._ctx, self._sub.job, job_name, {"input": items}, self._sub.queue
        )
        output = child.output
        final = output.get("final_output") if isinstance(output, dict) else output
        text = final if isinstance(final, str) else json.dumps(final)
        message = ResponseOutputMessage(
            id=f"msg_child_{child.job_id}",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise affidavit.ConfigError("streamed model responses are not recorded in affidavit jobs")


def handed_to_child(agent: Agent[Any], sub: SubAgentJob, ctx: AgentContext) -> Agent[Any]:
    """What a handoff to ``agent`` (registered with :func:`agent_job`) runs in the parent: a
    clone of it whose one turn is the child job (no tools, handoffs or guardrails of its own:
    the child has them)."""
    return agent.clone(
        model=_ChildTurns(sub, ctx),
        tools=[],
        handoffs=[],
        mcp_servers=[],
        input_guardrails=[],
        output_guardrails=[],
    )


def child_tool(tool: FunctionTool, sub: SubAgentJob, ctx: AgentContext, approve: Any) -> Any:
    """``on_invoke_tool`` of the agent tool ``tool``: each call a child job of ``ctx``'s job
    (``approve(tool_context, parsed, call_id)``: whether a person approves it first)."""
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
            await ctx.approval(_key(tool.name, call_id), payload=payload)
        try:
            child = await run_child(ctx, sub.job, job_name, {"input": text}, sub.queue)
        except ChildJobFailed as exc:  # (recorded: a recovery answers the model the same)
            return default_tool_error_function(tool_context, exc)
        output = child.output
        return output.get("final_output") if isinstance(output, dict) else output

    return invoke


def _input_text(parsed: Any) -> str:
    if isinstance(parsed, dict) and set(parsed) == {"input"} and isinstance(parsed["input"], str):
        return parsed["input"]
    return canonical(parsed).decode()


def _key(tool_name: str, call_id: str) -> str:
    key = f"approve:{tool_name}:{call_id}"
    if len(key) <= _MAX_KEY:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"approve:{tool_name[:100]}:{digest}"
