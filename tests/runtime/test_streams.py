"""Live streams (``ctx.emit``) on both backends: each value one ``stream_emitted`` event of the
sealed record; refused values record nothing; a recovered agent does not emit a recorded value
again, after a worker killed at a crash point or anywhere in its function."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit import (
    AgentContext,
    ConfigError,
    Runtime,
    StreamError,
    StreamLimit,
    ToolContext,
    ToolRegistry,
    agent,
    pure,
    tool,
    verify_job,
)
from affidavit.core.streams import MAX_VALUE_BYTES
from affidavit.packs import export_pack, verify_pack
from affidavit.record import job_trace
from affidavit.record._replay import build_from_events
from affidavit.runtime._sdk import ToolError
from tests.api import stream_tools
from tests.runtime.crash_tools import REGISTRY, counts
from tests.runtime.helpers import assert_log_sound, of_type, run_driver, wait_lease_expired

LEFT: list[ToolContext] = []  # the context of the last st_send call, kept past its return


@tool("st_send")
def send(ctx: ToolContext, to: str) -> dict[str, Any]:
    ctx.emit({"sending": to})
    LEFT[:] = [ctx]
    return {"sent": to}


@pure("st_words")
def words(ctx: ToolContext, text: str) -> list[str]:
    out = text.split()
    for w in out:
        ctx.emit({"word": w})
    return out


REFUSED: list[str] = []


@agent("st_agent", version="1")
def st_agent(ctx: AgentContext, text: str) -> dict[str, Any]:
    ctx.emit({"phase": "start"})
    found = ctx.call(words, text=text)
    for bad in ("x" * MAX_VALUE_BYTES, {1, 2}, float("nan")):
        try:
            ctx.emit(bad)
        except StreamError as exc:
            REFUSED.append(exc.message)
    sent = ctx.call(send, to="ops")
    ctx.emit({"phase": "done", "words": len(found)})
    return sent


@agent("st_capped", version="1", stream=StreamLimit(max_values=3, max_bytes=1000))
def st_capped(ctx: AgentContext) -> int:
    emitted = 0
    for i in range(5):
        try:
            ctx.emit(i)
            emitted += 1
        except StreamError as exc:
            REFUSED.append(exc.message)
    return emitted


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    REFUSED.clear()
    tools = ToolRegistry([send, words, st_agent, st_capped])
    with Runtime(store_url, tools=tools, lease_seconds=30) as runtime:
        yield runtime


def stream_of(events: list[Any]) -> list[dict[str, Any]]:
    return of_type(events, "stream_emitted")


def test_emits_are_sealed_events_that_verify(rt: Runtime, tmp_path: Path) -> None:
    job = rt.submit(st_agent, {"text": "a b"})
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    events = assert_log_sound(rt.store, job.job_id)
    values = stream_of(events)
    assert [v["value"] for v in values] == [
        {"phase": "start"},
        {"word": "a"},
        {"word": "b"},
        {"sending": "ops"},
        {"phase": "done", "words": 2},
    ]
    assert [v["seq"] for v in values] == [0, 1, 2, 3, 4]
    assert "node_id" not in values[0] and "node_id" not in values[4]
    assert (values[1]["node_id"], values[1]["attempt"]) == ("#0", 1)
    assert values[3]["node_id"] == "#1"
    # the refused values recorded nothing, and said why
    assert len(REFUSED) == 3
    assert "over the 65536" in REFUSED[0] and "not JSON" in REFUSED[1]
    replay = build_from_events(events)
    assert (replay.stream_values, replay.agent_emits) == (5, 2)
    result = verify_job(rt.store, job.job_id)
    assert result.ok, result.to_dict()
    pack = export_pack(rt.store, job.job_id, tmp_path / "pack")  # the values travel in its log
    checked = verify_pack(pack.pack_dir)
    assert (checked.verdict, checked.exit_code) == ("MATCH", 0), checked.errors


def test_runtime_follow_sees_values_while_the_job_runs(store_url: str) -> None:
    with Runtime(store_url, tools=stream_tools.TOOLS) as rt:
        job_id = rt.submit("gated_agent", {}).job_id
        gate = stream_tools.GATES[job_id] = threading.Event()
        runner = threading.Thread(target=rt.run_job, args=(job_id,), daemon=True)
        runner.start()
        seen = []
        for event in rt.follow(job_id):
            if event.type == "stream_emitted":
                seen.append(event.payload["value"])
                if event.payload["value"] == {"held": True}:
                    assert rt.get_job(job_id).status == "running"
                    gate.set()
        runner.join(30)
        assert seen == ["first", {"held": True}, "second"]
        assert event.type == "job_completed"  # it ends with the job
        assert list(rt.follow(job_id, after_version=event.version)) == []


def test_the_job_stream_limit_is_recorded_and_kept(rt: Runtime) -> None:
    job = rt.submit(st_capped, {})
    done = rt.run_job(job.job_id)
    assert (done.status, done.output) == ("completed", 3)
    events = rt.store.list_events(job.job_id)
    assert events[1].payload["stream"] == {"max_values": 3, "max_bytes": 1000}
    assert [v["value"] for v in stream_of(events)] == [0, 1, 2]
    assert REFUSED == ["ctx.emit: the job's stream has its 3 values already"] * 2
    assert verify_job(rt.store, job.job_id).ok


def test_a_plan_jobs_steps_emit_too(rt: Runtime, tmp_path: Path) -> None:
    plan = {
        "name": "streamed-plan",
        "nodes": [
            {"id": "w", "type": "pure", "tool": "st_words", "args": {"text": "x y"}},
            {"id": "s", "type": "tool", "tool": "st_send", "args": {"to": "${w}"},
             "depends_on": ["w"]},
        ],
    }  # fmt: skip
    job = rt.submit(plan, {})
    assert rt.run_job(job.job_id).status == "completed"
    events = assert_log_sound(rt.store, job.job_id)
    values = stream_of(events)
    assert [(v["node_id"], v["value"]) for v in values] == [
        ("w", {"word": "x"}),
        ("w", {"word": "y"}),
        ("s", {"sending": ["x", "y"]}),
    ]
    assert verify_job(rt.store, job.job_id).ok
    assert [n["state"] for n in job_trace(rt.store, job.job_id)["nodes"]] == [
        "pure",
        "side_effect_committed",
    ]
    checked = verify_pack(export_pack(rt.store, job.job_id, tmp_path / "pack").pack_dir)
    assert checked.verdict == "MATCH", checked.errors


def test_stream_limit_is_checked() -> None:
    with pytest.raises(ConfigError, match="max_values"):
        StreamLimit(max_values=0)
    with pytest.raises(ToolError, match="StreamLimit"):
        agent("st_bad", version="1", stream={"max_values": 1})  # type: ignore[arg-type]


def test_a_step_that_returned_emits_nothing_more(rt: Runtime) -> None:
    job = rt.submit(st_agent, {"text": "a"})
    assert rt.run_job(job.job_id).status == "completed"
    before = rt.get_job(job.job_id).version
    with pytest.raises(StreamError, match="is over"):
        LEFT[0].emit("late")  # (as from a thread the tool left running)
    assert rt.get_job(job.job_id).version == before


# --- recovery: a killed worker, then another runs the job --------------------------------------


@pytest.mark.parametrize(
    "point", ["stream.after_emit:2", "pure.after_execute", "tool.after_commit"]
)
def test_a_recovered_agent_does_not_emit_again(store_url: str, tmp_path: Path, point: str) -> None:
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit("crash_stream_agent", {"side": str(side), "amount": 10}).job_id
        proc = run_driver(store_url, "--job", job_id, "--lease", "0.5", crash=point)
        assert proc.returncode == -9, f"driver did not die by SIGKILL: {proc}"
        before = [v["value"] for v in stream_of(rt.store.list_events(job_id))]
        assert before[:2] == (
            ["start"] if point == "tool.after_commit" else ["start", {"charged": 10}]
        )
        wait_lease_expired(rt.store, job_id)
        assert rt.run_until_idle() == 1
        assert rt.get_job(job_id).status == "completed"
        events = assert_log_sound(rt.store, job_id)
        values = stream_of(events)
        agent_values = [v["value"] for v in values if "node_id" not in v]
        assert agent_values == ["start", {"charged": 10}, "done"]  # each once
        tokens = [v["value"] for v in values if "node_id" in v]
        thought = counts(side, "think")[(job_id, "#1")]
        # the streaming step emits as often as it ran: again only when a crash cut it off
        assert thought == (2 if point == "pure.after_execute" else 1)
        assert tokens == [{"token": 0}, {"token": 1}] * thought
        assert [v["seq"] for v in values] == list(range(len(values)))
        assert verify_job(rt.store, job_id).ok
