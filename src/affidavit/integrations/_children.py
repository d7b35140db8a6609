"""A framework's sub-agent run (Pydantic AI's ``await agent.run(...)`` inside another agent's
job, an OpenAI Agents SDK ``agent.as_tool``) as a child job of the job it is made in.

The child is the ``job`` step ``ctx.start_job`` records (created once per parent step, also
across crashes: its idempotency key is the step's) and the ``join`` step ``ctx.join`` records
(a durable wait: no worker holds the parent while the child runs). A recovery replays the
parent's function, which makes the same two calls at the same sequence numbers: the first
returns the child it created, the second its recorded result (or waits again).
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

from affidavit import AgentContext, ChildResult

#: The most a sub-agent's prompt may weigh (UTF-8 bytes) in its child job's input: a byte
#: bound, as a handed-over conversation's, since bytes are what the child's input is stored as.
MAX_PROMPT_BYTES = 4 * 1024 * 1024
#: The longest approval or wait key a framework's tool call gives the runtime.
MAX_CALL_KEY = 200


class ChildJobFailed(RuntimeError):
    """A sub-agent's child job did not complete: ``result`` says how it ended (``failed``
    with its ``error``, or ``cancelled``). The parent's code may catch it (the result is
    recorded: a recovery raises it again at the same point) or let it fail the parent."""

    def __init__(self, agent: str, result: ChildResult) -> None:
        self.result = result
        detail = result.error.get("message") if isinstance(result.error, dict) else result.error
        super().__init__(
            f"the child job {result.job_id} of agent {agent!r} ended {result.status}"
            + (f": {detail}" if detail else "")
        )


def check_prompt(agent: str, prompt: Any) -> str:
    """The prompt a child job is given, or :class:`ValueError` (nothing recorded)."""
    if not isinstance(prompt, str):
        raise ValueError(
            f"agent {agent!r} runs as a child job with a text prompt, not {type(prompt).__name__}"
        )
    size = len(prompt.encode("utf-8", "surrogatepass"))
    if size > MAX_PROMPT_BYTES:
        raise ValueError(
            f"the prompt for agent {agent!r} is {size} bytes (UTF-8); a child job's prompt is "
            f"at most {MAX_PROMPT_BYTES}"
        )
    return prompt


def call_key(kind: str, tool_name: str, call_id: str) -> str:
    """The approval or wait key ``KIND:TOOL:CALL_ID`` of a framework's tool call, at most
    :data:`MAX_CALL_KEY` characters (a longer one keeps the tool name's first 100 characters
    and a digest of the whole)."""
    key = f"{kind}:{tool_name}:{call_id}"
    if len(key) <= MAX_CALL_KEY:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{kind}:{tool_name[:100]}:{digest}"


async def run_child(
    parent: AgentContext, job: Any, agent: str, job_input: dict[str, Any], queue: str | None
) -> ChildResult:
    """Start the child job ``job`` (an agent job) with ``job_input`` in ``queue`` and wait for
    it (both recorded steps of the parent's async function). Returns how it completed.

    Raises:
        ChildJobFailed: the child failed or was cancelled.
        BaseException subclass: the parent waits for the child (its run ends here, to be
            continued by whichever worker claims it once the child has ended).
    """
    handle = await _settled(parent.start_job(job, job_input, queue=queue))
    result: ChildResult = await _settled(parent.join(handle))
    if result.status != "completed":
        raise ChildJobFailed(agent, result)
    return result


async def _settled(answer: Any) -> Any:
    """A ``ctx`` call's value: awaited in an ``async def`` agent, as is in a plain ``def`` one
    (which runs the framework's run on a loop of its own, ``run_sync``)."""
    return await answer if inspect.isawaitable(answer) else answer
