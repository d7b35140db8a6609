"""Two Pydantic AI agents with ``AffidavitDurability``, one delegating to the other, for the
delegation tests: imported by the test process and loaded with ``--tools`` by worker
subprocesses. Their models are scripted ``FunctionModel``s; each time one is asked is a line
in the side channel ``PYDAI_SIDE`` (``model``, with the agent and the turn).

- ``pydai_helper`` (the sub-agent): turn 0 calls ``pydai_charge(amount=N)`` for the prompt
  ``charge N`` (an ``@affidavit.tool`` with a ``reconcile`` hook; its effect is a line in
  ``PYDAI_LEDGER`` tagged with the step's idempotency key); turn 1 answers ``charged N``. The
  prompt ``fail`` makes it raise (its job fails).
- ``pydai_boss`` (the parent): turn 0 calls ``note`` (an ordinary tool step) and ``delegate``
  (``durable=False``: it runs in the job's function and awaits ``helper.run``) in one
  response, or ``inline`` (an ordinary tool that awaits ``helper.run`` inside its step) for
  the prompt ``inline``; turn 1 answers with what the tools returned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import affidavit
from affidavit import ToolContext
from affidavit.integrations.pydantic_ai import AffidavitDurability, ChildJobFailed
from tests.integrations.pydai_tools import _prompt, side


def _turn(messages: list[ModelMessage]) -> int:
    return sum(1 for m in messages if isinstance(m, ModelResponse))


def _returns(messages: list[ModelMessage]) -> list[str]:
    return [
        f"{p.tool_name}={p.content}"
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def helper_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = _turn(messages)
    side("model", agent="helper", turn=turn)
    prompt = _prompt(messages)
    if prompt == "fail":
        raise RuntimeError("the helper cannot")
    amount = int(prompt.removeprefix("charge "))
    if turn == 0:
        call = ToolCallPart("pydai_charge", {"amount": amount}, tool_call_id="c-charge")
        return ModelResponse(parts=[call])
    return ModelResponse(parts=[TextPart(f"charged {amount}")])


def boss_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = _turn(messages)
    side("model", agent="boss", turn=turn)
    prompt = _prompt(messages)
    if turn > 0:
        return ModelResponse(parts=[TextPart("; ".join(sorted(_returns(messages))))])
    if prompt == "inline":
        return ModelResponse(parts=[ToolCallPart("inline", {"amount": 3}, tool_call_id="c-in")])
    amount = int(prompt.removeprefix("pay "))
    parts = [
        ToolCallPart("note", {"text": f"paying {amount}"}, tool_call_id="c-note"),
        ToolCallPart("delegate", {"amount": amount}, tool_call_id="c-delegate"),
    ]
    return ModelResponse(parts=parts)


def _ledger() -> Path:
    return Path(os.environ["PYDAI_LEDGER"])


@affidavit.tool("pydai_charge")
def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
    """Charge ``amount`` (the real effect: a line in the ledger file)."""
    fd = os.open(_ledger(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{amount} {ctx.idempotency_key}\n".encode())
    finally:
        os.close(fd)
    return {"charged": amount}


@charge.reconcile
def _charged(ctx: ToolContext, amount: int) -> dict[str, Any] | None:
    try:
        lines = _ledger().read_text().splitlines()
    except FileNotFoundError:
        return None
    side("reconcile", amount=amount)
    return {"charged": amount} if f"{amount} {ctx.idempotency_key}" in lines else None


helper_durability = AffidavitDurability(tools=[charge])
helper = Agent(FunctionModel(helper_script), name="pydai_helper", capabilities=[helper_durability])

boss_durability = AffidavitDurability()
boss = Agent(FunctionModel(boss_script), name="pydai_boss", capabilities=[boss_durability])


@boss.tool_plain
def note(text: str) -> str:
    side("note", text=text)
    return "noted"


@boss.tool_plain(durable=False)
async def delegate(amount: int) -> str:
    """Runs in the boss job's function: the helper's run is a child job."""
    prompt = "fail" if amount < 0 else f"charge {amount}"
    try:
        result = await helper.run(prompt)
    except ChildJobFailed as exc:
        return f"{exc.result.status}"
    side("delegated", child=result.metadata["affidavit_child_job_id"] if result.metadata else None)
    return str(result.output)


@boss.tool_plain
async def inline(amount: int) -> str:
    """An ordinary tool step that would run the helper inside it: refused."""
    result = await helper.run(f"charge {amount}")
    return str(result.output)


@affidavit.agent("pydai_plain_boss", version="1")
async def plain_boss(ctx: affidavit.AgentContext, amount: int) -> dict[str, Any]:
    """An affidavit agent function (no Pydantic AI of its own) delegating to the helper."""
    result = await helper.run(f"charge {amount}")
    return {"output": result.output}


@affidavit.agent("pydai_sync_boss", version="1")
def sync_boss(ctx: affidavit.AgentContext, amount: int) -> dict[str, Any]:
    """The same from a plain ``def`` agent (``run_sync``: a loop of its own)."""
    return {"output": helper.run_sync(f"charge {amount}").output}


REGISTRATIONS = [
    *boss_durability.registrations,
    *helper_durability.registrations,
    plain_boss,
    sync_boss,
]
