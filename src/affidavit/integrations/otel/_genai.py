"""The GenAI semantic-convention attributes of a job's steps, read from what its log recorded.

A model request (a Pydantic AI agent's ``NAME.model_request`` step, an OpenAI Agents SDK run's
``openai_agents.model_response`` step) is a ``chat MODEL`` span; a tool call that a framework
made through one generic step (``NAME...call_tool``, ``openai_agents.call_tool[_approved]``) is
an ``execute_tool TOOL`` span with the tool the model named and the model's call id; a Pydantic
AI function tool's step ``NAME.tool.TOOL`` is an ``execute_tool TOOL`` span.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

OPENAI_AGENTS_MODEL = "openai_agents.model_response"
OPENAI_AGENTS_TOOLS = frozenset({"openai_agents.call_tool", "openai_agents.call_tool_approved"})
#: between an agent's name and its tool's in the step of a Pydantic AI function tool
PYDANTIC_AI_TOOL = ".tool."
#: the provider of a job with no model request of a known provider
DEFAULT_PROVIDER = "affidavit"


def is_model_step(called: dict[str, Any]) -> bool:
    name = called.get("tool_name")
    if not isinstance(name, str) or not isinstance(called.get("args"), dict):
        return False
    return name == OPENAI_AGENTS_MODEL or (
        name.endswith(".model_request") and isinstance(called["args"].get("model"), str)
    )


def provider_and_model(called: dict[str, Any]) -> tuple[str, str]:
    """The provider and model a model step's args name: Pydantic AI records
    ``SYSTEM:MODEL`` (``openai:gpt-5``); the OpenAI Agents SDK ``CLASS:MODEL`` or a name."""
    label = str(called["args"].get("model") or "")
    head, sep, tail = label.partition(":")
    if called.get("tool_name") == OPENAI_AGENTS_MODEL:
        return "openai", tail if sep else label
    return (head, tail) if sep else (DEFAULT_PROVIDER, label)


def chat_attributes(called: dict[str, Any]) -> dict[str, Any]:
    provider, model = provider_and_model(called)
    return {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.CHAT.value,
        gen_ai.GEN_AI_PROVIDER_NAME: provider,
        gen_ai.GEN_AI_REQUEST_MODEL: model,
    }


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def response_attributes(output: Any) -> dict[str, Any]:
    """What a recorded model response says: the model that answered, its id, the tokens."""
    if not isinstance(output, dict):
        return {}
    attributes: dict[str, Any] = {}
    if isinstance(output.get("model_name"), str):  # Pydantic AI's ModelResponse
        attributes[gen_ai.GEN_AI_RESPONSE_MODEL] = output["model_name"]
    response_id = output.get("provider_response_id") or output.get("response_id")
    if isinstance(response_id, str):
        attributes[gen_ai.GEN_AI_RESPONSE_ID] = response_id
    usage = output.get("usage")
    if isinstance(usage, dict):
        for key, name in (
            ("input_tokens", gen_ai.GEN_AI_USAGE_INPUT_TOKENS),
            ("output_tokens", gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS),
        ):
            count = _count(usage.get(key))
            if count is not None:
                attributes[name] = count
    return attributes


def tool_attributes(tool_name: str, step_id: str, called: dict[str, Any] | None) -> dict[str, Any]:
    """``execute_tool``'s attributes: the tool the model named and its call id when the step
    is a framework's generic tool step, else the registered tool and the step id."""
    args = called.get("args") if called is not None else None
    name, call_id = tool_name, step_id
    generic = tool_name in OPENAI_AGENTS_TOOLS or tool_name.endswith(".call_tool")
    if generic and isinstance(args, dict) and isinstance(args.get("tool"), str):
        name = args["tool"]
        if isinstance(args.get("call_id"), str) and args["call_id"]:
            call_id = args["call_id"]
    elif PYDANTIC_AI_TOOL in tool_name:  # AffidavitDurability's step of one function tool
        name = tool_name.split(PYDANTIC_AI_TOOL, 1)[1] or tool_name
    return {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value,
        gen_ai.GEN_AI_TOOL_NAME: name,
        gen_ai.GEN_AI_TOOL_CALL_ID: call_id,
        gen_ai.GEN_AI_TOOL_TYPE: "function",
        "affidavit.tool.step_name": tool_name,
    }


def agent_attributes(
    job_id: str, name: str, started: dict[str, Any], provider: str
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        gen_ai.GEN_AI_OPERATION_NAME: gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value,
        gen_ai.GEN_AI_PROVIDER_NAME: provider,
        gen_ai.GEN_AI_AGENT_NAME: name,
        gen_ai.GEN_AI_CONVERSATION_ID: job_id,
    }
    if isinstance(started.get("agent_version"), str):
        attributes[gen_ai.GEN_AI_AGENT_VERSION] = started["agent_version"]
    if isinstance(started.get("agent_hash"), str):
        attributes[gen_ai.GEN_AI_AGENT_ID] = started["agent_hash"]
    return attributes
