"""An OpenAI Agents SDK agent run by ``AffidavitRunner`` in an affidavit agent job, for the
integration tests: imported by the test process and loaded with ``--tools`` by worker
subprocesses (the same source, the same version).

The model is a scripted ``agents.Model`` (no network). What really happens is appended to a side
channel (``OAI_SIDE``, one JSON line per event, a single ``os.write`` on an ``O_APPEND``
descriptor, so a line survives a SIGKILL right after it): each time the model is asked
(``model``, with its turn), each real ``lookup`` and ``send_mail`` call. The file tool's effect
is a line in the file it writes, tagged with the step's idempotency key.

Prompts (the job input's ``prompt``):

- ``write TEXT to PATH``: turn 0 looks the text up (``lookup``, a plain SDK function tool),
  turn 1 writes it to PATH (``oai_write_file``, an ``@affidavit.tool`` with a ``reconcile``
  hook, through ``ledger_tool``), turn 2 answers;
- ``mail ADDRESS``: turn 0 calls ``send_mail`` (``needs_approval=True``), turn 1 answers;
- ``two A B``: turn 0 asks for two ``lookup`` calls at once, turn 1 answers;
- ``guarded TEXT``: an input guardrail checks the prompt first (tripped by ``forbidden``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    GuardrailFunctionOutput,
    Model,
    ModelResponse,
    RunConfig,
    Usage,
    function_tool,
    input_guardrail,
)
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import affidavit
from affidavit import ToolContext
from affidavit.integrations.openai_agents import AffidavitRunner, ledger_tool


def side(kind: str, **fields: Any) -> None:
    """Append one line to the side channel ``$OAI_SIDE`` (when set)."""
    path = os.environ.get("OAI_SIDE")
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


def _item(item: Any) -> dict[str, Any]:
    return item if isinstance(item, dict) else item.model_dump()


def _call(name: str, args: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        call_id=call_id,
        name=name,
        arguments=json.dumps(args),
        id=f"fc_{call_id}",
    )


def _say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """Answers by the prompt and the turn (how many tool calls the conversation holds)."""

    calls = 0  # in this process

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = (
            [{"role": "user", "content": input}]
            if isinstance(input, str)
            else [_item(i) for i in input]
        )
        prompt = next(i["content"] for i in items if i.get("role") == "user")
        turn = sum(1 for i in items if i.get("type") == "function_call")
        outputs = [i.get("output") for i in items if i.get("type") == "function_call_output"]
        ScriptedModel.calls += 1
        side("model", turn=turn)
        usage = Usage(requests=1, input_tokens=300, output_tokens=200, total_tokens=500)
        if prompt.startswith("mail "):
            out: Any = (
                _call("send_mail", {"to": prompt[5:]}, "call-mail")
                if turn == 0
                else _say(f"mailed: {outputs}")
            )
        elif prompt.startswith("two "):  # one turn asking for two calls, then an answer
            first, second = prompt[4:].split()
            if not outputs:
                calls = [_call("lookup", {"q": q}, f"call-{q}") for q in (first, second)]
                return ModelResponse(output=list(calls), usage=usage, response_id=None)
            out = _say(f"looked up: {outputs}")
        elif prompt.startswith("guarded "):
            out = _say(f"ok: {prompt[8:]}")
        else:
            text, _, path = prompt.removeprefix("write ").partition(" to ")
            if turn == 0:
                out = _call("lookup", {"q": text}, "call-1")
            elif turn == 1:
                out = _call("oai_write_file", {"path": path, "text": text}, "call-2")
            else:
                out = _say(f"wrote {text!r} to {path}")
        return ModelResponse(output=[out], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


@function_tool
def lookup(q: str) -> dict[str, Any]:
    """Look ``q`` up (counted in the side channel)."""
    side("lookup", q=q)
    return {"q": q, "known": True}


@function_tool(needs_approval=True)
def send_mail(to: str) -> str:
    """Send a mail (a person approves each call)."""
    side("mail", to=to)
    return f"sent to {to}"


@affidavit.tool("oai_write_file")
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


@input_guardrail(name="no_forbidden")
def no_forbidden(context: Any, agent: Agent[Any], value: Any) -> GuardrailFunctionOutput:
    side("guardrail")
    return GuardrailFunctionOutput(
        output_info={"checked": True}, tripwire_triggered="forbidden" in str(value)
    )


agent = Agent(
    name="support",
    instructions="Be brief.",
    model=ScriptedModel(),
    tools=[lookup, ledger_tool(write_file), send_mail],
    input_guardrails=[no_forbidden],
)


QUIET = RunConfig(tracing_disabled=True)  # no trace export (there is no network here)


@affidavit.agent("oai_support", version="1")
async def oai_support(ctx: affidavit.AgentContext, prompt: str) -> dict[str, Any]:
    result = await AffidavitRunner.run(agent, prompt, run_config=QUIET)
    return {"output": result.final_output}


REGISTRATIONS = [oai_support, write_file]
