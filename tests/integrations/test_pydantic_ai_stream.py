"""Pydantic AI's ``event_stream_handler`` inside affidavit jobs (``AffidavitDurability``'s, and
the deprecated ``AffidavitAgent``'s), on both backends (the real
library, a scripted streaming ``FunctionModel``): each model request is one recorded step whose
events reach the handler and the job's stream live, while it runs; a model step replayed after
the job waited for an approval reaches neither again."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import AgentStreamEvent, ModelMessage, ModelResponse, PartDeltaEvent
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import affidavit
from affidavit import Runtime, ToolRegistry
from affidavit.integrations.pydantic_ai import AffidavitAgent, AffidavitDurability

ASKED: list[int] = []  # the turns the model was really asked, in this process
HANDLED: list[tuple[int, str]] = []  # (turn, kind) of the model events the handler saw
_MODEL_EVENTS = ("PartStartEvent", "PartDeltaEvent", "PartEndEvent")


def _script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise AssertionError("the streaming agent is only asked to stream")


async def _stream(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    turn = sum(1 for m in messages if isinstance(m, ModelResponse))
    ASKED.append(turn)
    if turn == 0:
        yield {0: DeltaToolCall(name="send_note", json_args='{"to": "ops"}', tool_call_id="n-1")}
        return
    for chunk in ("noted ", "and ", "done"):
        yield chunk


async def _handler(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    turn = sum(1 for m in ctx.messages if isinstance(m, ModelResponse))
    async for event in events:  # (tool calls' events too, from the run itself: not counted)
        if type(event).__name__ in _MODEL_EVENTS:
            HANDLED.append((turn, type(event).__name__))


def send_note(to: str) -> str:
    return f"noted for {to}"


streamer = AffidavitDurability(version="1", event_stream_handler=_handler)
Agent(
    FunctionModel(_script, stream_function=_stream),
    name="streamer",
    capabilities=[streamer],
).tool_plain(requires_approval=True)(send_note)
# the deprecated wrapper, over an agent made without the capability
streaming = Agent(FunctionModel(_script, stream_function=_stream))
streaming.tool_plain(requires_approval=True)(send_note)


def test_model_events_stream_live_and_are_not_sent_again(store_url: str) -> None:
    ASKED.clear()
    HANDLED.clear()
    with Runtime(store_url, tools=ToolRegistry(streamer.registrations)) as rt:
        job_id = rt.submit("streamer", {"prompt": "note it"}).job_id
        assert rt.run_job(job_id).status == "waiting"  # the tool call needs an approval
        first = [e for e in rt.store.list_events(job_id) if e.type == "stream_emitted"]
        assert first and all(e.payload["node_id"] == "#0" for e in first)
        handled_first = list(HANDLED)
        assert handled_first and {t for t, _ in handled_first} == {0}
        rt.signal(job_id, "approve:send_note:n-1", {"approved": True}, approver="ann")
        done = rt.run_job(job_id)
        assert done.status == "completed", done.error
        assert done.output == {"output": "noted and done"}
        assert ASKED == [0, 1]  # turn 0 was replayed from its record
        events = rt.store.list_events(job_id)
        values = [e.payload for e in events if e.type == "stream_emitted"]
        # turn 0's events once (not again when it was replayed), then turn 1's, live
        assert [v["node_id"] for v in values].count("#0") == len(first)
        later = [v["value"]["pydantic_ai_event"] for v in values if v["node_id"] != "#0"]
        deltas = [e["delta"]["content_delta"] for e in later if e["event_kind"] == "part_delta"]
        assert "".join(d for d in deltas) in ("and done", "noted and done")
        assert [t for t, _ in HANDLED].count(0) == len(handled_first)  # not handled again
        assert (1, PartDeltaEvent.__name__) in HANDLED
        model_steps = [
            e.payload for e in events if e.type == "step_called" and e.payload["kind"] == "pure"
        ]
        assert all(s["args"]["stream"] is True for s in model_steps)
        assert affidavit.verify_job(rt.store, job_id).ok


capped = AffidavitAgent(
    streaming,
    name="capped_streamer",
    version="1",
    event_stream_handler=_handler,
    stream=affidavit.StreamLimit(max_values=2, max_bytes=100_000),
)


def test_past_the_stream_limit_events_still_reach_the_handler(store_url: str) -> None:
    HANDLED.clear()
    with Runtime(store_url, tools=ToolRegistry(capped.registrations)) as rt:
        job_id = rt.submit("capped_streamer", {"prompt": "note it"}).job_id
        assert rt.run_job(job_id).status == "waiting"
        rt.signal(job_id, "approve:send_note:n-1", {"approved": True}, approver="ann")
        assert rt.run_job(job_id).status == "completed"
        values = [e for e in rt.store.list_events(job_id) if e.type == "stream_emitted"]
        assert len(values) == 2  # the limit
        assert len(HANDLED) > 2 and (1, "PartDeltaEvent") in HANDLED  # the handler saw them all
        assert affidavit.verify_job(rt.store, job_id).ok
