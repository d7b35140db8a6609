"""The recorded forms of what the OpenAI Agents SDK hands affidavit: a ``ModelResponse`` as
JSON and back, a tool's output as JSON, and the digest of a conversation (what a model call
is asked about) that a recovery must reproduce to get the recorded answer."""

from __future__ import annotations

from typing import Any

from agents.items import ModelResponse, TResponseOutputItem
from agents.usage import deserialize_usage, serialize_usage
from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from affidavit import canonical_sha256

_OUTPUT_ITEM: TypeAdapter[TResponseOutputItem] = TypeAdapter(TResponseOutputItem)


def jsonable(value: Any) -> Any:
    """``value`` as JSON values: pydantic models as their fields that were set (the SDK's own
    run-state form), anything JSON cannot hold as the text the SDK would show the model."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return to_jsonable_python(value, fallback=str)


def dump_response(response: ModelResponse) -> dict[str, Any]:
    """The recorded form of a model response: its output items, its usage, its ids."""
    return {
        "output": [jsonable(item) for item in response.output],
        "usage": serialize_usage(response.usage),
        "response_id": response.response_id,
        "request_id": response.request_id,
    }


def load_response(recorded: Any) -> ModelResponse:
    """The model response a step recorded (:func:`dump_response`).

    Raises:
        TypeError: the record does not have that shape (a value a person recorded by hand).
    """
    if not isinstance(recorded, dict) or not isinstance(recorded.get("output"), list):
        raise TypeError(f"a model step recorded {type(recorded).__name__}, not a model response")
    usage = recorded.get("usage")
    return ModelResponse(
        output=[_OUTPUT_ITEM.validate_python(item) for item in recorded["output"]],
        usage=deserialize_usage(usage if isinstance(usage, dict) else {}),
        response_id=recorded.get("response_id"),
        request_id=recorded.get("request_id"),
    )


def tokens_of(response: ModelResponse) -> int:
    """The tokens a response spent (input and output), what a job's budget counts."""
    usage = response.usage
    return max(0, int(usage.input_tokens or 0)) + max(0, int(usage.output_tokens or 0))


def conversation_digest(
    system_instructions: str | None, model_input: Any, tool_names: list[str]
) -> str:
    """SHA-256 of what a model call is asked: its instructions, its input items, the names of
    the tools and handoffs it may call. A recovery asking about another conversation (other
    instructions, other tools, another history) is caught as nondeterministic."""
    return canonical_sha256(
        {
            "instructions": system_instructions,
            "input": jsonable(model_input),
            "tools": sorted(tool_names),
        }
    )
