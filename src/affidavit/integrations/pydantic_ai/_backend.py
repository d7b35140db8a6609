"""The affidavit backend of Pydantic AI's durable operations: each operation the durability
capability's base binds becomes a recorded step of the running agent job (see
:mod:`._steps` for which one); outside a job an operation runs as it would without
durability.

1. a model request (streamed or not) is the pure step ``NAME.model_request``; its args name the
   model, the turn and a digest of the conversation (a recovery asking about another
   conversation parks as nondeterministic); its output is the JSON codec's payload of the
   response, replayed on recovery without asking the model;
2. a function tool call is the tool step ``NAME.tool.TOOL`` with the tool's own arguments, or
   the ``@affidavit.tool`` itself for one given as ``tools=``; an MCP call is
   ``NAME.mcp.TOOLSET.call_tool``, its discovery ``...get_tools`` and ``...get_instructions``
   (a dynamic toolset's: ``NAME.dynamic.TOOLSET.call_tool`` and ``...get_tools``);
3. argument validation and event-handler calls run inline: they are recomputed from what the
   record holds, and have no effect of their own to keep to once;
4. any other operation is the pure step ``NAME.operation``.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError
from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.durable_exec import (
    BoundDurableOperation,
    DurableOperation,
    DurableOperationBackend,
    EventStreamHandlerId,
    ModelRequestId,
    ModelRequestParams,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
    durable_unit_scope,
)
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_core import to_jsonable_python

from affidavit import AgentContext, Tool, ToolContext, canonical_sha256
from affidavit.integrations._bridge import record
from affidavit.integrations.pydantic_ai._steps import AgentSteps

if typing.TYPE_CHECKING:
    from pydantic_ai.durable_exec import CallToolResult

#: The current job's context while this agent's run is in progress (``None``: not durable).
JobLookup = Callable[[], AgentContext | None]


class AffidavitOperationBackend(DurableOperationBackend[None]):
    """Binds each durable operation to the step that records it (no engine config)."""

    def __init__(
        self, steps: AgentSteps, current: JobLookup, ledger_tools: dict[str, Tool]
    ) -> None:
        self.steps = steps
        self._current = current
        self._ledger = ledger_tools

    def bind(
        self, operation: DurableOperation[Any, Any, Any]
    ) -> BoundDurableOperation[Any, Any, Any]:
        return _Bound(operation, self)

    def config_for_tool(
        self, operation: DurableOperation[Any, Any, Any], *, tool: object | None, tool_name: str
    ) -> Literal[False] | None:
        return None

    def registrations(self) -> Sequence[Callable[..., object]]:
        return ()

    async def dispatch(self, operation: DurableOperation[Any, Any, Any], params: Any) -> Any:
        ctx = self._current()
        op = operation.operation_id
        if ctx is None or isinstance(op, ToolsetValidateToolArgumentsId | EventStreamHandlerId):
            return await operation.handler(params)
        if isinstance(op, ToolsetCallToolId) and op.toolset_kind == "function":
            own = self._ledger.get(params.name)
            if own is not None:  # the @affidavit.tool's own step: its reconcile hook holds
                value = await _called(ctx, own, to_jsonable_python(params.tool_args))
                return _CALL_RESULT.validate_python({"kind": "tool_return", "result": value})
        step, args = self._step_of(op, params)

        async def make(_: ToolContext) -> Any:
            with durable_unit_scope():
                return operation.result_codec.dump(await operation.handler(params))

        payload = await record(ctx, step, args, make)
        if isinstance(op, ToolsetCallToolId):
            return _call_result(payload)
        return operation.result_codec.load(payload)

    def _step_of(self, op: Any, params: Any) -> tuple[Tool, dict[str, Any]]:
        steps = self.steps
        if isinstance(op, ModelRequestId):
            return steps.model, _model_args(params, streaming=op.streaming)
        if isinstance(op, ToolsetCallToolId) and op.toolset_kind == "function":
            return steps.function_tool(params.name), to_jsonable_python(params.tool_args)
        if isinstance(op, ToolsetCallToolId):  # an MCP or a dynamic toolset's: one step each
            args = {
                "tool": params.name,
                "args": to_jsonable_python(params.tool_args),
                "call_id": params.ctx.tool_call_id or "",
            }
            return steps.toolset_call(op.toolset_kind, op.toolset_id), args
        if isinstance(op, ToolsetGetToolsId):
            return steps.discovery(op.toolset_kind, op.toolset_id, "get_tools"), {}
        if isinstance(op, ToolsetGetInstructionsId):
            return steps.discovery("mcp", op.toolset_id, "get_instructions"), {}
        # (the union of operation ids grows in minor releases: whatever else, recorded once)
        return steps.operation, {"operation": _describe(op)}


class _Bound(BoundDurableOperation[Any, Any, Any]):
    def __init__(
        self, operation: DurableOperation[Any, Any, Any], backend: AffidavitOperationBackend
    ) -> None:
        self._operation = operation
        self._backend = backend

    @property
    def operation(self) -> DurableOperation[Any, Any, Any]:
        return self._operation

    async def __call__(self, params: Any, *, config: object | None = None) -> Any:
        return await self._backend.dispatch(self._operation, params)


def _describe(op: Any) -> str:
    fields = getattr(op, "__dataclass_fields__", {})
    parts = [f"{k}={getattr(op, k)!r}" for k in sorted(fields)]
    return f"{type(op).__name__}({', '.join(parts)})"


async def _called(ctx: AgentContext, tool: Tool, args: dict[str, Any]) -> Any:
    answer = ctx.call(tool, **args)
    return await answer if asyncio.isfuture(answer) or hasattr(answer, "__await__") else answer


def _load_call_result() -> TypeAdapter[Any]:
    from pydantic_ai.durable_exec import CallToolResult

    return TypeAdapter(CallToolResult)


_CALL_RESULT = _load_call_result()


def _call_result(payload: Any) -> CallToolResult:
    """A tool step's recorded outcome as the call's result. A value without the codec's shape
    (a result a person recorded deciding a park) is the tool's return."""
    try:
        loaded: CallToolResult = _CALL_RESULT.validate_python(payload)
    except ValidationError:
        loaded = _CALL_RESULT.validate_python({"kind": "tool_return", "result": payload})
    return loaded


def _model_args(params: ModelRequestParams, *, streaming: bool) -> dict[str, Any]:
    model = params.run_context.model
    args: dict[str, Any] = {
        "model": f"{model.system}:{model.model_name}",
        "turn": sum(1 for m in params.messages if isinstance(m, ModelResponse)),
        "messages": len(params.messages),
        "history_sha256": history_digest(params.messages),
    }
    if streaming:
        args["stream"] = True
    return args


def history_digest(messages: list[ModelMessage]) -> str:
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


__all__ = ["AffidavitOperationBackend", "history_digest"]
