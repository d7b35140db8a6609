"""The steps an OpenAI Agents SDK run is recorded as, registered (in the module-level registry,
which ``--tools`` modules fill) when this package is imported. Their names and versions are
compatibility data: a job records them, and a worker recovers it only when they match
(``tests/integrations/test_openai_agents.py`` pins them).

- ``openai_agents.model_response`` (pure): one model call; its output the response
  (:func:`~._codec.dump_response`), its usage reported for the job's budget;
- ``openai_agents.call_tool`` (tool): one call of an SDK function tool, through the ledger; its
  result ``{"return": ...}``; caught in flight it gets the job's in-flight policy (no
  ``reconcile`` hook can exist for a plain function);
- ``openai_agents.call_tool_approved`` (tool, ``requires_approval=True``): the same for a call
  its tool's ``needs_approval`` asks a person about: it acts only once an approval of exactly
  that call is recorded, decided by another principal than the job's submitter;
- ``openai_agents.guardrail`` (pure): one run of an input or output guardrail; its output
  ``{"tripwire_triggered", "output_info"}``.
"""

from __future__ import annotations

from typing import Any

from agents.items import ModelResponse

import affidavit
from affidavit import RetryableError, ToolContext
from affidavit.integrations._bridge import run_pending
from affidavit.integrations.openai_agents._codec import dump_response, jsonable, tokens_of

#: The run a step names when it runs outside one (``run_pending``).
OPENAI_RUN = "OpenAI Agents SDK run (call AffidavitRunner.run inside the agent function)"

#: Recorded with every step's name: a change of how a step records is a new version.
STEP_VERSION = "1"
MODEL_STEP = "openai_agents.model_response"
TOOL_STEP = "openai_agents.call_tool"
APPROVED_TOOL_STEP = "openai_agents.call_tool_approved"
GUARDRAIL_STEP = "openai_agents.guardrail"


def _retryable(exc: BaseException) -> bool:
    """A provider's trouble worth another attempt: a lost connection, a rate limit, an outage."""
    import openai

    return isinstance(
        exc,
        openai.APIConnectionError | openai.RateLimitError | openai.InternalServerError,
    )


@affidavit.pure(MODEL_STEP, version=STEP_VERSION, retry=3)
def model_response(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    """Ask the model (the coroutine the run parked) and record its response and usage."""
    try:
        response = run_pending(ctx, args, run_by=OPENAI_RUN)
    except Exception as exc:
        if _retryable(exc):
            raise RetryableError(f"{type(exc).__name__}: {exc}") from exc
        raise
    if not isinstance(response, ModelResponse):
        raise TypeError(f"the model returned {type(response).__name__}, not a ModelResponse")
    tokens = tokens_of(response)
    if tokens:  # what the job's budget counts (affidavit.Budget model_tokens)
        ctx.report_usage(tokens=tokens)
    return dump_response(response)


def _call(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"return": jsonable(run_pending(ctx, args, run_by=OPENAI_RUN))}


@affidavit.tool(TOOL_STEP, version=STEP_VERSION)
def call_tool(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    """Run one SDK function tool call (at most once: the ledger)."""
    return _call(ctx, args)


@affidavit.tool(APPROVED_TOOL_STEP, version=STEP_VERSION, requires_approval=True)
def call_tool_approved(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    """Run one SDK function tool call that a person approved (the runtime's approval gate)."""
    return _call(ctx, args)


@affidavit.pure(GUARDRAIL_STEP, version=STEP_VERSION)
def guardrail(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    """Run one guardrail and record what it decided."""
    output = run_pending(ctx, args, run_by=OPENAI_RUN)
    return {
        "tripwire_triggered": bool(output.tripwire_triggered),
        "output_info": jsonable(output.output_info),
    }


#: What this package registers, e.g. for ``Runtime(url, tools=ToolRegistry([*STEPS, ...]))``.
STEPS = [model_response, call_tool, call_tool_approved, guardrail]
