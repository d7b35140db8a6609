"""A Pydantic AI agent run as an affidavit job, for the integration tests: imported by the test
process and loaded with ``--tools`` by worker subprocesses (the same source, the same version).

The agent has the ``AffidavitDurability`` capability; its model is Pydantic AI's
``FunctionModel`` following a script (no network). What really
happens is appended to a side channel (``PYDAI_SIDE``, one JSON line per event, a single
``os.write`` on an ``O_APPEND`` descriptor, so a line survives a SIGKILL right after it):
each time the model is asked (``model``, with its turn), each real ``lookup`` call. The file
tool's effect is a line in the file it writes, tagged with the step's idempotency key.

Prompts (the job input's ``prompt``):

- ``write TEXT to PATH``: turn 0 looks the text up, turn 1 writes it to PATH
  (``pydai_write_file``, an ``@affidavit.tool`` with a ``reconcile`` hook), turn 2 answers;
- ``mail ADDRESS``: turn 0 calls ``send_mail`` (``requires_approval=True``), turn 1 answers.
"""

from __future__ import annotations

import json
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
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import affidavit
from affidavit import ToolContext
from affidavit.integrations.pydantic_ai import AffidavitDurability


def side(kind: str, **fields: Any) -> None:
    """Append one line to the side channel ``$PYDAI_SIDE`` (when set)."""
    path = os.environ.get("PYDAI_SIDE")
    if not path:
        return
    line = (
        json.dumps({"kind": kind, **fields, "pid": os.getpid()}, sort_keys=True) + "\n"
    ).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_side(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _prompt(messages: list[ModelMessage]) -> str:
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    raise AssertionError("no prompt")


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model: what it answers depends on the prompt and the turn."""
    turn = sum(1 for m in messages if isinstance(m, ModelResponse))
    side("model", turn=turn)
    prompt = _prompt(messages)
    if prompt.startswith("mail "):
        if turn == 0:
            return ModelResponse(
                parts=[ToolCallPart("send_mail", {"to": prompt[5:]}, tool_call_id="call-mail")]
            )
        returned = [
            p.content
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart)
        ]
        return ModelResponse(parts=[TextPart(f"mailed: {returned}")])
    text, _, path = prompt.removeprefix("write ").partition(" to ")
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("lookup", {"q": text}, tool_call_id="call-1")])
    if turn == 1:
        return ModelResponse(
            parts=[
                ToolCallPart(
                    "pydai_write_file", {"path": path, "text": text}, tool_call_id="call-2"
                )
            ]
        )
    return ModelResponse(parts=[TextPart(f"wrote {text!r} to {path}")])


@affidavit.tool("pydai_write_file")
def write_file(ctx: ToolContext, path: str, text: str) -> dict[str, Any]:
    """Append ``text`` to the file at ``path`` (the real side effect)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{text} {ctx.idempotency_key}\n".encode())
    finally:
        os.close(fd)
    return {"path": path, "bytes": len(text) + 1}


@write_file.reconcile
def _written(ctx: ToolContext, path: str, text: str) -> dict[str, Any] | None:
    """Did this step's write happen? Its line carries the step's idempotency key."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return None
    if f"{text} {ctx.idempotency_key}" in lines:
        return {"path": path, "bytes": len(text) + 1}
    return None


support = AffidavitDurability(tools=[write_file])
agent = Agent(
    FunctionModel(script), name="support", instructions="Be brief.", capabilities=[support]
)


@agent.tool_plain
def lookup(q: str) -> dict[str, Any]:
    """Look ``q`` up (a read, counted in the side channel)."""
    side("lookup", q=q)
    return {"q": q, "known": True}


@agent.tool_plain(requires_approval=True)
def send_mail(to: str) -> str:
    """Send a mail (a person approves each call)."""
    side("mail", to=to)
    return f"sent to {to}"
