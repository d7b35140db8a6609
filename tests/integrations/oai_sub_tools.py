"""An OpenAI Agents SDK agent that calls another as a tool (``agent.as_tool``), the other
registered with ``agent_job``, for the child-job tests: imported by the test process and loaded
with ``--tools`` by worker subprocesses. Both models are scripted (no network); each time one is
asked is a line in the side channel ``OAI_SIDE`` (``model``, with the agent and the turn).

- ``oai_refunder`` (the sub-agent's job): for the input ``refund N``, turn 0 calls
  ``oai_refund`` (an ``@affidavit.tool`` with a ``reconcile`` hook, through ``ledger_tool``; its
  effect is a line in ``OAI_LEDGER`` tagged with the step's idempotency key), turn 1 answers
  ``refunded N``; the input ``fail`` makes its model raise (the child fails).
- ``oai_sub_triage`` (the parent): turn 0 calls ``note`` (an ordinary tool step) and ``refund``
  (the refunder as a tool: a child job) with the prompt's input; turn 1 answers with what the
  tools returned.
- ``oai_front``: turn 0 hands off to the refunder (``transfer_to_refunder``): the refunder's
  turns are a child job whose input is the conversation handed to it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agents import Agent, Model, ModelResponse, Usage, function_tool

import affidavit
from affidavit import ToolContext
from affidavit.integrations.openai_agents import STEPS, AffidavitRunner, agent_job, ledger_tool
from tests.integrations.oai_tools import QUIET, _call, _item, _say, side


def _items(input: Any) -> list[dict[str, Any]]:
    return (
        [{"role": "user", "content": input}]
        if isinstance(input, str)
        else [_item(i) for i in input]
    )


class RefunderModel(Model):
    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = _items(input)
        prompt = next(i["content"] for i in items if i.get("role") == "user")
        turn = sum(1 for i in items if i.get("name") == "oai_refund")  # (its own calls)
        side("model", agent="refunder", turn=turn)
        if prompt == "fail":
            raise RuntimeError("the refunder cannot")
        amount = int(prompt.removeprefix("refund "))
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        out: Any = (
            _call("oai_refund", {"amount": amount}, "call-refund")
            if turn == 0
            else _say(f"refunded {amount}")
        )
        return ModelResponse(output=[out], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


class TriageModel(Model):
    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = _items(input)
        prompt = next(i["content"] for i in items if i.get("role") == "user")
        outputs = [str(i.get("output")) for i in items if i.get("type") == "function_call_output"]
        turn = 1 if outputs else 0
        side("model", agent="triage", turn=turn)
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        if turn:
            return ModelResponse(output=[_say("; ".join(outputs))], usage=usage, response_id=None)
        calls = [
            _call("note", {"text": f"triage {prompt}"}, "call-note"),
            _call("refund", {"input": prompt}, "call-child"),
        ]
        return ModelResponse(output=list(calls), usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


def _ledger() -> Path:
    return Path(os.environ["OAI_LEDGER"])


@affidavit.tool("oai_refund")
def refund(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """Refund ``amount`` (the real effect: a line in the ledger file)."""
    fd = os.open(_ledger(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{amount} {ctx.idempotency_key}\n".encode())
    finally:
        os.close(fd)
    return {"refunded": amount}


@refund.reconcile
def _refunded(ctx: ToolContext, amount: int) -> dict[str, Any] | None:
    try:
        lines = _ledger().read_text().splitlines()
    except FileNotFoundError:
        return None
    side("reconcile", amount=amount)
    return {"refunded": amount} if f"{amount} {ctx.idempotency_key}" in lines else None


@function_tool
def note(text: str) -> str:
    """Note ``text`` (counted in the side channel)."""
    side("note", text=text)
    return "noted"


refunder = Agent(name="refunder", model=RefunderModel(), tools=[ledger_tool(refund)])
refunder_job = agent_job(refunder, name="oai_refunder", run_config=QUIET)

triage = Agent(
    name="triage",
    model=TriageModel(),
    tools=[note, refunder.as_tool("refund", "Refund an order")],
)


class FrontModel(Model):
    """Hands every conversation to the refunder."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        side("model", agent="front", turn=0)
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        call = _call("transfer_to_refunder", {}, "call-handoff")
        return ModelResponse(output=[call], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


front = Agent(name="front", model=FrontModel(), handoffs=[refunder])


@affidavit.agent("oai_front", version="1")
async def oai_front(ctx: affidavit.AgentContext, prompt: str) -> dict[str, Any]:
    """Hands off to the refunder: the refunder's turns are a child job."""
    result = await AffidavitRunner.run(front, prompt, run_config=QUIET)
    return {"output": result.final_output, "last_agent": result.last_agent.name}


@affidavit.agent("oai_sub_triage", version="1")
async def oai_triage(ctx: affidavit.AgentContext, prompt: str) -> dict[str, Any]:
    result = await AffidavitRunner.run(triage, prompt, run_config=QUIET)
    return {"output": result.final_output}


REGISTRATIONS = [oai_triage, oai_front, refunder_job, refund, *STEPS]
