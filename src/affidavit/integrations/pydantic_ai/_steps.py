"""The steps one agent's Pydantic AI runs are recorded as, and their names.

The names are compatibility data: a job records them, and a worker recovers it only with the
same ones (``tests/integrations/test_pydantic_ai_capability.py`` pins them). For an agent
``NAME``:

- ``NAME`` — the agent job (input ``{"prompt": ...}``, output ``{"output": ...}``);
- ``NAME.model_request`` (pure) — one model request; its output the ``ModelResponse`` (the
  JSON codec's payload), its token usage reported with the step (the job's budget counts it);
- ``NAME.tool.TOOL`` (tool) — one call of the function tool ``TOOL``, through the invocation
  ledger; its args the tool's arguments, its output the call's result (``{"kind":
  "tool_return", "result": ...}``, or the control-flow answer: a retry, a deferral);
- an ``@affidavit.tool`` given as ``tools=`` — its own step under its own name (its
  ``reconcile`` hook, approval rule, retries and limit hold);
- ``NAME.mcp.TOOLSET.call_tool`` (tool) — one ``tools/call`` of the MCP toolset ``TOOLSET``
  (args ``{"tool", "args", "call_id"}``; the call carries the step's keys in ``_meta``);
- ``NAME.mcp.TOOLSET.get_tools`` / ``.get_instructions`` (pure) — the server's tool list and
  instructions as the run saw them;
- ``NAME.dynamic.TOOLSET.call_tool`` (tool) and ``.get_tools`` (pure) — the same for a
  ``DynamicToolset`` (its id: ``DynamicToolset(..., id=...)``);
- ``NAME.operation`` (pure, args ``{"operation": ...}``) — any other durable operation
  Pydantic AI asks for (message compaction, a capability's operation), recorded once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import affidavit
from affidavit import RetryableError, Tool, ToolContext
from affidavit.integrations._bridge import run_pending

#: The run a step names when it runs outside one (``run_pending``).
PYDANTIC_AI_RUN = "Pydantic AI run"

#: Recorded with each step's name: a change of how a step records is a new version.
STEP_VERSION = "1"


def model_request_name(agent: str) -> str:
    return f"{agent}.model_request"


def function_tool_name(agent: str, tool: str) -> str:
    return f"{agent}.tool.{tool}"


def toolset_name(agent: str, kind: str, toolset_id: str, operation: str) -> str:
    return f"{agent}.{kind}.{toolset_id}.{operation}"


def operation_name(agent: str) -> str:
    return f"{agent}.operation"


def _model_step(ctx: ToolContext, **args: Any) -> Any:
    from pydantic_ai.exceptions import ModelAPIError

    try:
        payload = run_pending(ctx, args, run_by=PYDANTIC_AI_RUN)
    except ModelAPIError as exc:  # the provider's trouble: worth another attempt
        raise RetryableError(f"{type(exc).__name__}: {exc}") from exc
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if isinstance(usage, dict):
        tokens = sum(
            v for k in ("input_tokens", "output_tokens") if isinstance(v := usage.get(k), int)
        )
        if tokens:  # what the job's budget counts (affidavit.Budget model_tokens)
            ctx.report_usage(tokens=tokens)
    return payload


def _bridged_step(ctx: ToolContext, **args: Any) -> Any:
    return run_pending(ctx, args, run_by=PYDANTIC_AI_RUN)


class AgentSteps:
    """The steps of one agent, made once and kept (the registry refuses a second function
    under a name): the fixed ones at once, a function tool's when it is first seen."""

    def __init__(
        self,
        agent: str,
        *,
        in_flight: str,
        model_retries: int,
        model_limit: affidavit.Limit | None,
    ) -> None:
        self.agent = agent
        self._in_flight = in_flight
        self._lock = threading.Lock()
        self.model = affidavit.pure(
            model_request_name(agent), version=STEP_VERSION, retry=model_retries, limit=model_limit
        )(_clone(_model_step, "model_request"))
        self.operation = affidavit.pure(operation_name(agent), version=STEP_VERSION)(
            _clone(_bridged_step, "operation")
        )
        self._tools: dict[str, Tool] = {}

    def function_tool(self, tool: str) -> Tool:
        """The tool step of the function tool ``tool`` (registered in the module registry too,
        which a worker started with ``--tools`` looks tools up in)."""
        return self._made(function_tool_name(self.agent, tool), kind="tool")

    def toolset_call(self, kind: str, toolset_id: str) -> Tool:
        """The tool step of a call of an MCP (``kind`` ``mcp``) or dynamic toolset's tool."""
        return self._made(toolset_name(self.agent, kind, toolset_id, "call_tool"), kind="tool")

    def discovery(self, kind: str, toolset_id: str, operation: str) -> Tool:
        """The pure step of a toolset's ``get_tools`` (or an MCP server's instructions)."""
        return self._made(toolset_name(self.agent, kind, toolset_id, operation), kind="pure")

    def _made(self, name: str, *, kind: str) -> Tool:
        with self._lock:
            made = self._tools.get(name)
            if made is None:
                fn = _clone(_bridged_step, name.rsplit(".", 1)[-1])
                if kind == "tool":
                    made = affidavit.tool(name, version=STEP_VERSION, in_flight=self._in_flight)(fn)
                else:
                    made = affidavit.pure(name, version=STEP_VERSION)(fn)
                self._tools[name] = made
            return made

    def all(self) -> list[Tool]:
        with self._lock:
            return [self.model, self.operation, *self._tools.values()]


def _clone(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A function of its own (the registry keys a tool by its function) that calls ``fn``."""

    def step(ctx: ToolContext, **args: Any) -> Any:
        return fn(ctx, **args)

    step.__name__ = step.__qualname__ = f"pydantic_ai_{name}"
    step.__doc__ = fn.__doc__
    return step
