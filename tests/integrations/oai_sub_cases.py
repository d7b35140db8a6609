"""More OpenAI Agents SDK agents run as child jobs (``agent_job``), for the child-job tests;
the models are scripted (no network):

- ``oai_counter``: an agent whose output type is ``int`` (the SDK wraps it: its model answers
  ``{"response": 7}``); ``oai_count_front`` hands off to it, ``oai_count_triage`` calls it as a
  tool;
- ``ping`` and ``pong``: each hands off to the other, both child jobs, until the conversation
  holds six handoffs; ``oai_pingpong`` starts at ping with ``max_turns=3``;
- ``oai_refused``: a run a child job cannot serve (``case``: a RunConfig naming every agent's
  model, with a handoff or an agent tool; a server-kept conversation with a handoff);
- ``oai_retrying``: a handoff to the refunder under a retry policy that retries everything;
- ``oai_budgeted``: a refunder registered with a budget of its own (no tool call), called as
  a tool by ``oai_budget_triage`` (whose budget allows five);
- ``oai_told_triage``: the refunder as a tool whose ``failure_error_function`` is ``_told``
  (``told``) or ``None``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from agents import Agent, Model, ModelResponse, ModelSettings, Usage
from agents.retry import ModelRetrySettings

import affidavit
from affidavit.integrations.openai_agents import AffidavitRunner, agent_job
from tests.integrations import oai_sub_tools as st
from tests.integrations.oai_sub_tools import _items
from tests.integrations.oai_tools import QUIET, _call, _say

_USAGE = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)


class _Scripted(Model):
    def __init__(self, answer: Any) -> None:
        self._answer = answer  # items -> the one output item

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        return ModelResponse(output=[self._answer(_items(input))], usage=_USAGE, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


def _seven(items: list[dict[str, Any]]) -> Any:
    return _say(json.dumps({"response": 7}))


counter = Agent(name="counter", model=_Scripted(_seven), output_type=int)
counter_job = agent_job(counter, name="oai_counter", run_config=QUIET)


def _to_counter(items: list[dict[str, Any]]) -> Any:
    return _call("transfer_to_counter", {}, "call-count")


def _triage_count(items: list[dict[str, Any]]) -> Any:
    outputs = [str(i.get("output")) for i in items if i.get("type") == "function_call_output"]
    return _say(f"counted {outputs[0]}") if outputs else _call("count", {"input": "x"}, "call-c")


count_front = Agent(name="count_front", model=_Scripted(_to_counter), handoffs=[counter])
count_triage = Agent(
    name="count_triage",
    model=_Scripted(_triage_count),
    tools=[counter.as_tool("count", "Count")],
)


@affidavit.agent("oai_count_front", version="1")
async def oai_count_front(ctx: affidavit.AgentContext, prompt: str) -> dict[str, Any]:
    result = await AffidavitRunner.run(count_front, prompt, run_config=QUIET)
    return {"output": result.final_output}


@affidavit.agent("oai_count_triage", version="1")
async def oai_count_triage(ctx: affidavit.AgentContext, prompt: str) -> dict[str, Any]:
    result = await AffidavitRunner.run(count_triage, prompt, run_config=QUIET)
    return {"output": result.final_output}


def _bouncer(other: str) -> Any:
    def answer(items: list[dict[str, Any]]) -> Any:
        handoffs = sum(1 for i in items if i.get("type") == "function_call")
        if handoffs >= 6:  # (bounds the cycle for code that does not)
            return _say(f"stopped after {handoffs}")
        return _call(f"transfer_to_{other}", {}, f"call-{handoffs}")

    return answer


ping = Agent(name="ping", model=_Scripted(_bouncer("pong")))
pong = Agent(name="pong", model=_Scripted(_bouncer("ping")), handoffs=[ping])
ping.handoffs.append(pong)
ping_job = agent_job(ping, name="oai_ping", run_config=QUIET)
pong_job = agent_job(pong, name="oai_pong", run_config=QUIET)


@affidavit.agent("oai_pingpong", version="1")
async def oai_pingpong(ctx: affidavit.AgentContext, prompt: str) -> dict[str, Any]:
    result = await AffidavitRunner.run(ping, prompt, run_config=QUIET, max_turns=3)
    return {"output": result.final_output}


@affidavit.agent("oai_refused", version="1")
async def oai_refused(ctx: affidavit.AgentContext, case: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"run_config": QUIET}
    agent = st.front
    if case in ("model_handoff", "model_tool"):
        kwargs["run_config"] = dataclasses.replace(QUIET, model=st.FrontModel())
        agent = st.front if case == "model_handoff" else st.triage
    else:  # the conversation kept by the server
        kwargs[case] = "resp_1" if case == "previous_response_id" else "conv_1"
    result = await AffidavitRunner.run(agent, "refund 7", **kwargs)
    return {"output": result.final_output}


def _always(context: Any) -> bool:
    return True


RETRYING = dataclasses.replace(
    QUIET,
    model_settings=ModelSettings(retry=ModelRetrySettings(max_retries=2, policy=_always)),
)


@affidavit.agent("oai_retrying", version="1")
async def oai_retrying(ctx: affidavit.AgentContext, prompt: str) -> dict[str, Any]:
    result = await AffidavitRunner.run(st.front, prompt, run_config=RETRYING)
    return {"output": result.final_output}


budgeted = Agent(name="budgeted", model=st.RefunderModel(), tools=st.refunder.tools)
BUDGET = affidavit.Budget(tool_calls=0)
budgeted_job = agent_job(
    budgeted, name="oai_budgeted", run_config=QUIET, budget=BUDGET, in_flight="fail"
)
budget_triage = Agent(
    name="budget_triage",
    model=st.TriageModel(),
    tools=[st.note, budgeted.as_tool("refund", "Refund an order")],
)


@affidavit.agent("oai_budget_triage", version="1", budget=affidavit.Budget(tool_calls=5))
async def oai_budget_triage(ctx: affidavit.AgentContext, prompt: str) -> dict[str, Any]:
    result = await AffidavitRunner.run(budget_triage, prompt, run_config=QUIET)
    return {"output": result.final_output}


def _told(context: Any, error: Exception) -> str:
    return f"no refund ({type(error).__name__})"


told_triage = Agent(
    name="told_triage",
    model=st.TriageModel(),
    tools=[st.note, st.refunder.as_tool("refund", "Refund", failure_error_function=_told)],
)
raising_triage = Agent(
    name="raising_triage",
    model=st.TriageModel(),
    tools=[st.note, st.refunder.as_tool("refund", "Refund", failure_error_function=None)],
)


@affidavit.agent("oai_told_triage", version="1")
async def oai_told_triage(ctx: affidavit.AgentContext, prompt: str, told: bool) -> dict[str, Any]:
    agent = told_triage if told else raising_triage
    result = await AffidavitRunner.run(agent, prompt, run_config=QUIET)
    return {"output": result.final_output}


REGISTRATIONS = [
    *st.REGISTRATIONS,
    counter_job,
    oai_count_front,
    oai_count_triage,
    ping_job,
    pong_job,
    oai_pingpong,
    oai_refused,
    oai_retrying,
    budgeted_job,
    oai_budget_triage,
    oai_told_triage,
]
