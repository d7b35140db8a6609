"""A Pydantic AI agent with the ``AffidavitDurability`` capability, for the capability's tests:
imported by the test process and loaded with ``--tools`` by worker subprocesses.

Its model is a scripted ``FunctionModel`` (no network); each time it is asked is a line in the
side channel ``PYDAI_SIDE`` (:func:`tests.integrations.pydai_tools.side`). Prompts:

- ``pay N``: turn 0 calls ``pydai_pay(amount=N)``, an ``@affidavit.tool`` that needs a
  person's approval above 100 and has a ``reconcile`` hook (its effect is a line in
  ``PYDAI_LEDGER`` tagged with the step's idempotency key); turn 1 answers;
- ``both``: turn 0 calls ``left`` and ``right`` in one response; each waits for the other
  at a barrier (run one at a time, the first would wait alone and fail); turn 1 answers.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

import affidavit
from affidavit import ToolContext
from affidavit.integrations.pydantic_ai import AffidavitDurability
from tests.integrations.pydai_tools import _prompt, side

#: both tools of one turn meet here (a broken barrier: they did not run at once)
MEETING = threading.Barrier(2, timeout=30)


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = sum(1 for m in messages if isinstance(m, ModelResponse))
    side("model", turn=turn)
    prompt = _prompt(messages)
    usage = RequestUsage(input_tokens=10 + turn, output_tokens=5)
    if turn > 0:
        return ModelResponse(parts=[TextPart(f"done: {prompt}")], usage=usage)
    if prompt == "both":
        parts = [
            ToolCallPart("left", {"n": 1}, tool_call_id="c-left"),
            ToolCallPart("right", {"n": 2}, tool_call_id="c-right"),
        ]
        return ModelResponse(parts=parts, usage=usage)
    amount = int(prompt.removeprefix("pay "))
    call = ToolCallPart("pydai_pay", {"amount": amount}, tool_call_id="c-pay")
    return ModelResponse(parts=[call], usage=usage)


def _ledger() -> Path:
    return Path(os.environ["PYDAI_LEDGER"])


@affidavit.tool("pydai_pay", requires_approval=lambda amount: amount > 100)
def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """Pay ``amount`` (the real effect: a line in the ledger file)."""
    fd = os.open(_ledger(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{amount} {ctx.idempotency_key}\n".encode())
    finally:
        os.close(fd)
    return {"paid": amount}


@pay.reconcile
def _paid(ctx: ToolContext, amount: int) -> dict[str, Any] | None:
    """Did this step's payment happen? Its line carries the step's idempotency key."""
    try:
        lines = _ledger().read_text().splitlines()
    except FileNotFoundError:
        return None
    side("reconcile", amount=amount)
    return {"paid": amount} if f"{amount} {ctx.idempotency_key}" in lines else None


durability = AffidavitDurability(tools=[pay])
agent = Agent(FunctionModel(script), name="pydai_cap", capabilities=[durability])


@agent.tool_plain
def left(n: int) -> int:
    side("left", n=n)
    MEETING.wait()
    return n


@agent.tool_plain
def right(n: int) -> int:
    side("right", n=n)
    MEETING.wait()
    return n
