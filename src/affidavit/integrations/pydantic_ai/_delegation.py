"""Agent delegation: ``await agent_b.run(prompt)`` inside a job of another agent, where
``agent_b`` has its own ``AffidavitDurability``, runs ``agent_b`` as a child job of that job.

1. where: in the parent job's own code — a tool marked ``durable=False`` (Pydantic AI's
   opt-out: it runs in the agent job's function, not as a tool step) or a plain
   ``@affidavit.agent`` function. Inside a recorded step (an ordinary tool call, which is at
   most once and would stay in flight while the parent waits) it is refused;
2. what is recorded in the parent: a ``job`` step (``{"agent": NAME, "input": {"prompt":
   ...}}``, the child's id) and a ``join`` step (the child's result); the child is the agent
   job ``NAME`` with its own record, on any worker;
3. what the caller gets: an ``AgentRunResult`` whose ``output`` is the child's output
   validated against ``agent_b``'s output type, no messages (the conversation is the
   child's record), its ``metadata`` naming the child (``affidavit_child_job_id``).
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.agent import AbstractAgent, AgentRunResult
from pydantic_ai.exceptions import UserError
from pydantic_ai.tools import RunContext

from affidavit import AgentContext
from affidavit.integrations._bridge import CURRENT_STEP
from affidavit.integrations._children import check_prompt, run_child

#: The metadata key of a delegated run's result that names its child job.
CHILD_JOB_KEY = "affidavit_child_job_id"

_RESULT: TypeAdapter[AgentRunResult[Any]] = TypeAdapter(AgentRunResult[Any])


def refuse_in_step(name: str) -> None:
    """Raise when a run of the agent ``name`` is made inside a recorded step of a job.

    Raises:
        pydantic_ai.exceptions.UserError: it is (the step's own outcome: the job fails).
    """
    step = CURRENT_STEP.get()
    if step is None:
        return
    raise UserError(
        f"agent {name!r} has AffidavitDurability and runs inside the recorded step "
        f"{step.step_id} of job {step.job_id}: "
        "a sub-agent runs as a child job, from the parent job's own code. Mark the tool that "
        "delegates durable=False (@agent.tool(durable=False)): it then runs in the job's "
        "function, and the sub-agent's run is a child job the parent waits for durably"
    )


async def run_delegated(
    parent: AgentContext,
    job: Any,
    name: str,
    agent: AbstractAgent[Any, Any],
    ctx: RunContext[Any],
    queue: str | None,
) -> AgentRunResult[Any]:
    """Run ``agent`` (the agent job ``job``, named ``name``) as a child job of ``parent``'s
    job with the prompt of the run ``ctx`` describes, and return its result.

    Raises:
        pydantic_ai.exceptions.UserError: the run cannot be a child job (a message history,
            a prompt that is not text); nothing is recorded.
        ChildJobFailed: the child failed or was cancelled.
    """
    if any(not _is_prompt(m, ctx.prompt) for m in ctx.messages):
        raise UserError(
            f"agent {name!r} runs as a child job from its prompt alone: a message_history "
            "cannot be its input (give the context in the prompt)"
        )
    try:
        prompt = check_prompt(name, ctx.prompt)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    child = await run_child(parent, job, name, {"prompt": prompt}, queue)
    recorded = child.output
    output = recorded.get("output") if isinstance(recorded, dict) else recorded
    metadata = {CHILD_JOB_KEY: child.job_id}
    return _RESULT.validate_python(
        {"output": _typed(agent, output), "messages": [], "metadata": metadata}
    )


def _is_prompt(message: Any, prompt: Any) -> bool:
    """Whether ``message`` is the request made of the run's own prompt (Pydantic AI may have
    added it to the run's messages before the run's hooks run)."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    if not isinstance(message, ModelRequest):
        return False
    return all(isinstance(p, UserPromptPart) and p.content == prompt for p in message.parts)


def _typed(agent: AbstractAgent[Any, Any], output: Any) -> Any:
    """The child's output (JSON) as the agent's output type, when that is a type."""
    output_type: Any = agent.output_type
    if not (inspect.isclass(output_type) or hasattr(output_type, "__origin__")):
        return output  # (an output spec: a list of types, ToolOutput, a function)
    try:
        return TypeAdapter(output_type).validate_python(output)
    except ValidationError as exc:  # (the child's record holds what it returned)
        raise UserError(f"the child job's output is not the agent's output type: {exc}") from exc
