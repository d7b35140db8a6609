"""Independent nodes of one job at the same time (``step_concurrency``), on SQLite and
PostgreSQL: the tools overlap, every step keeps its protocol, and whatever ends the run (a
failure, a wait) takes effect only after the running steps recorded their outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from affidavit import RetryableError, Runtime, Tool, ToolContext, ToolRegistry
from tests.runtime.helpers import assert_log_sound, ledger_rows, node, of_type, plan


class Spans:
    """When each tool call started and ended (monotonic clock), by node."""

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[float, float]]] = {}
        self.lock = threading.Lock()

    def run(self, ctx: ToolContext, seconds: float) -> None:
        t0 = time.monotonic()
        time.sleep(seconds)
        with self.lock:
            self.spans.setdefault(ctx.node_id, []).append((t0, time.monotonic()))

    def overlap(self, a: str, b: str) -> bool:
        (a0, a1), (b0, b1) = self.spans[a][0], self.spans[b][0]
        return a0 < b1 and b0 < a1


@pytest.fixture
def spans() -> Spans:
    return Spans()


@pytest.fixture
def rt(store_url: str, spans: Spans) -> Iterator[Runtime]:
    def slow(ctx: ToolContext, seconds: float, fail: bool = False) -> dict[str, Any]:
        spans.run(ctx, seconds)
        if fail:
            raise ValueError(f"{ctx.node_id} failed")
        return {"node": ctx.node_id, "key": ctx.external_key}

    def join(ctx: ToolContext, parts: list[Any]) -> list[Any]:
        return [p["node"] for p in parts]

    tools = ToolRegistry([Tool("slow", slow, "tool"), Tool("join", join, "pure")])
    with Runtime(store_url, tools=tools, step_concurrency=3) as runtime:
        yield runtime


FAN = plan(
    node("a", "slow", args={"seconds": 0.4}),
    node("b", "slow", args={"seconds": 0.4}),
    node("c", "slow", args={"seconds": 0.4}),
    node("all", "join", "pure", args={"parts": ["${a}", "${b}", "${c}"]}, deps=["a", "b", "c"]),
)


def test_independent_tools_overlap_and_the_join_waits(rt: Runtime, spans: Spans) -> None:
    job_id = rt.submit(FAN, {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "completed", job.error
    assert job.output == {"all": ["a", "b", "c"]}
    assert spans.overlap("a", "b") and spans.overlap("b", "c") and spans.overlap("a", "c")
    assert {n: len(s) for n, s in spans.spans.items()} == {"a": 1, "b": 1, "c": 1}
    events = assert_log_sound(rt.store, job_id)
    # the join started after all three committed
    versions = {(e.type, e.payload.get("node_id")): e.version for e in events}
    assert versions[("node_started", "all")] > max(
        versions[("node_finished", n)] for n in ("a", "b", "c")
    )
    assert all(r.status == "committed" for r in ledger_rows(rt.store, job_id))


def test_sequential_by_default(store_url: str, spans: Spans) -> None:
    def slow(ctx: ToolContext, seconds: float) -> dict[str, Any]:
        spans.run(ctx, seconds)
        return {"node": ctx.node_id}

    tools = ToolRegistry([Tool("slow", slow, "tool")])
    graph = plan(node("a", "slow", args={"seconds": 0.1}), node("b", "slow", args={"seconds": 0.1}))
    with Runtime(store_url, tools=tools) as one:
        job_id = one.submit(graph, {}).job_id
        one.run_until_idle()
        assert one.get_job(job_id).status == "completed"
    assert not spans.overlap("a", "b")


def test_a_failure_waits_for_the_running_steps_to_record(rt: Runtime, spans: Spans) -> None:
    graph = plan(
        node("quick_fail", "slow", args={"seconds": 0.05, "fail": True}),
        node("long", "slow", args={"seconds": 0.5}),
        node("after", "join", "pure", args={"parts": ["${long}"]}, deps=["long", "quick_fail"]),
        retry={"max_attempts": 1, "backoff_seconds": 0},
    )
    job_id = rt.submit(graph, {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed" and job.error["message"] == "quick_fail failed"
    events = assert_log_sound(rt.store, job_id)  # nothing after job_failed, nothing open
    assert events[-1].type == "job_failed"
    # the step that was running when the other failed still committed its effect
    rows = {r.node_id: r.status for r in ledger_rows(rt.store, job_id)}
    assert rows == {"quick_fail": "failed", "long": "committed"}
    assert "after" not in {p["node_id"] for p in of_type(events, "node_started")}


def test_a_wait_runs_alone(rt: Runtime, spans: Spans) -> None:
    graph = plan(
        node("long", "slow", args={"seconds": 0.4}),
        {"id": "ok", "type": "approval"},
        node("after", "join", "pure", args={"parts": ["${long}"]}, deps=["long", "ok"]),
    )
    job_id = rt.submit(graph, {}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "waiting"
    events = assert_log_sound(rt.store, job_id)
    assert events[-1].type == "job_waiting"
    finished = {p["node_id"] for p in of_type(events, "node_finished")}
    assert "long" in finished  # recorded before the job started waiting
    rt.signal(job_id, f"{job_id}:ok", {"approved": True}, approver="ann")
    rt.run_until_idle()
    assert rt.get_job(job_id).output == {"after": ["long"]}
    assert len(spans.spans["long"]) == 1


def test_a_failure_stops_the_retries_of_the_other_running_steps(store_url: str) -> None:
    """Once one step failed the job, a concurrent step whose try failed retryably starts no
    new try (a new effect in a failed job, and one a recovery would not make): its recorded
    retryable failure stays, and its backoff does not hold the job's end back."""
    side: list[str] = []
    first_try = threading.Event()

    def flaky(ctx: ToolContext) -> dict[str, Any]:
        side.append(f"flaky:{ctx.attempt}")
        if ctx.attempt == 1:
            first_try.set()
            raise RetryableError("busy")
        return {"charged": True}

    def decline(ctx: ToolContext) -> dict[str, Any]:
        first_try.wait(30)
        side.append("decline")
        raise ValueError("declined")

    tools = ToolRegistry([Tool("flaky", flaky, "tool"), Tool("decline", decline, "tool")])
    graph = plan(
        node("a", "flaky"),
        node("b", "decline"),
        # a backoff far longer than the other step takes to fail
        retry={"max_attempts": 3, "backoff_seconds": 30},
    )
    with Runtime(store_url, tools=tools, step_concurrency=2) as rt:
        job_id = rt.submit(graph, {}).job_id
        rt.run_until_idle()
        job = rt.get_job(job_id)
        assert job.status == "failed" and job.error["message"] == "declined"
        assert sorted(side) == ["decline", "flaky:1"]  # no second try of `a`
        events = assert_log_sound(rt.store, job_id)
        finished = {p["node_id"]: p["result_type"] for p in of_type(events, "node_finished")}
        assert finished == {"a": "retryable_failure", "b": "permanent_failure"}
        assert {r.node_id: r.status for r in ledger_rows(rt.store, job_id)} == {
            "a": "failed",
            "b": "failed",
        }
