"""Stopping a worker gracefully (``Worker.request_stop``), on SQLite and PostgreSQL: the step
that is running records its outcome, nothing more starts, and the job's lease is handed back so
that another worker continues it at once — every tool still runs exactly once.

The leases here are long (60 s): a job that was not handed back could not be taken over within
the test, so the second worker's ``until_idle`` run would find nothing runnable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from affidavit import RetryableError, Runtime, Tool, ToolContext, ToolRegistry
from affidavit.runtime._worker import Worker
from affidavit.verify import verify_job
from tests.runtime.helpers import Calls, assert_log_sound, ledger_rows, node, of_type, plan

LEASE = 60.0


class Gate:
    """A tool that reports when it is inside and waits until the test lets it return."""

    def __init__(self, calls: Calls, name: str) -> None:
        self.inside = threading.Event()
        self.open = threading.Event()
        self.name = name
        self._calls = calls

    def tool(self) -> Tool:
        def fn(ctx: ToolContext) -> dict[str, Any]:
            self._calls.add(ctx, self.name)
            self.inside.set()
            assert self.open.wait(30), "the test never opened the gate"
            return {"done": ctx.node_id}

        return Tool(self.name, fn, "tool")


def charge_tool(calls: Calls) -> Tool:
    def fn(ctx: ToolContext, value: Any = None) -> dict[str, Any]:
        calls.add(ctx, "charge")
        return {"charged": True}

    return Tool("charge", fn, "tool")


def double_tool(calls: Calls) -> Tool:
    def fn(ctx: ToolContext, value: Any) -> dict[str, Any]:
        calls.add(ctx, "double")
        return {"value": value}

    return Tool("double", fn, "pure")


@pytest.fixture
def open_runtime(store_url: str) -> Iterator[Callable[..., Runtime]]:
    opened: list[Runtime] = []

    def make(*tools: Tool, step_concurrency: int = 1) -> Runtime:
        rt = Runtime(
            store_url,
            tools=ToolRegistry(tools),
            lease_seconds=LEASE,
            step_concurrency=step_concurrency,
        )
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()


def run_in_thread(worker: Worker) -> tuple[threading.Thread, list[int]]:
    ran: list[int] = []
    thread = threading.Thread(target=lambda: ran.append(worker.run()), daemon=True)
    thread.start()
    return thread, ran


def second_worker(rt: Runtime, tools: ToolRegistry) -> Worker:
    """Another worker on the same database (its own id), as a second process would be."""
    return Worker(rt.store, tools, worker_id="second", lease_seconds=LEASE)


def test_stop_hands_the_job_back_after_the_running_step(open_runtime: Any, calls: Calls) -> None:
    gate = Gate(calls, "slow")
    tools = (gate.tool(), double_tool(calls), charge_tool(calls))
    rt = open_runtime(*tools)
    flow = plan(
        node("a", "slow"),
        node("b", "double", "pure", args={"value": "${a}"}, deps=["a"]),
        node("c", "charge", args={"value": "${b}"}, deps=["b"]),
    )
    job_id = rt.submit(flow, {}).job_id
    lines: list[tuple[str, str]] = []
    rt.worker.on_job = lambda job, status, seconds: lines.append((job, status))
    thread, ran = run_in_thread(rt.worker)
    assert gate.inside.wait(10)
    rt.worker.request_stop()
    assert thread.is_alive()  # it waits for the running step; nothing is cut off
    gate.open.set()
    thread.join(20)
    assert not thread.is_alive() and ran == [1]
    assert lines == [(job_id, "released")]

    job = rt.get_job(job_id)
    assert job.status == "running"
    assert job.lease_expires_at is not None and job.lease_expires_at <= time.time()
    assert job.lease_owner is None  # handed back: no worker holds it until one claims it
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "committed"  # the step that was running recorded its outcome
    assert (calls.count(name="slow"), calls.count(name="double"), calls.count(name="charge")) == (
        1,
        0,
        0,
    )
    assert rt.worker.run_once() is None  # a stopping worker claims nothing more

    assert second_worker(rt, ToolRegistry(tools)).run(until_idle=True) == 1
    assert rt.get_job(job_id).status == "completed"
    assert (calls.count(name="slow"), calls.count(name="double"), calls.count(name="charge")) == (
        1,
        1,
        1,
    )
    events = assert_log_sound(rt.store, job_id)
    assert [p["node_id"] for p in of_type(events, "tool_invocation_started")] == ["a", "c"]
    assert verify_job(rt.store, job_id).ok


def test_a_job_claimed_with_the_last_ones_end_is_handed_back_untouched(
    open_runtime: Any, calls: Calls
) -> None:
    """On PostgreSQL a worker's next claim travels with the transaction that ends its job; a
    worker asked to stop right after that end gives the job it took back untouched — pending,
    no owner, not a recovery — for any worker to run at once. (On SQLite the worker claims
    after the end, and a stopping worker claims nothing: the job was never taken.)"""
    tools = (charge_tool(calls),)
    rt = open_runtime(*tools)
    first = rt.submit(plan(node("c", "charge")), {}).job_id
    second = rt.submit(plan(node("c", "charge")), {}).job_id
    submitted = rt.get_job(second).version
    rt.worker.on_job = lambda job, status, seconds: rt.worker.request_stop()
    assert rt.worker.run() == 1
    assert rt.get_job(first).status == "completed"
    job = rt.get_job(second)
    assert (job.status, job.lease_owner, job.version) == ("pending", None, submitted)
    # taken with the first job's end (its attempt id stays, fencing nothing: nobody runs it)
    assert (job.attempt_id is not None) == (rt.store.backend == "postgresql")
    assert calls.count(name="charge") == 1

    ended: list[tuple[str, str]] = []
    other = second_worker(rt, ToolRegistry(tools))
    other.on_job = lambda job, status, seconds: ended.append((job, status))
    assert other.run(until_idle=True) == 1
    assert ended == [(second, "completed")] and calls.count(name="charge") == 2
    assert verify_job(rt.store, second).ok


@pytest.mark.parametrize("step_concurrency", [1, 2])
def test_stop_ends_a_retry_backoff_and_the_next_worker_counts_on(
    open_runtime: Any, calls: Calls, step_concurrency: int
) -> None:
    failed_once = threading.Event()

    def flaky(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "flaky")
        if ctx.attempt == 1:
            failed_once.set()
            raise RetryableError("upstream 503")
        return {"attempt": ctx.attempt}

    tool = Tool("flaky", flaky, "tool")
    rt = open_runtime(tool, step_concurrency=step_concurrency)
    backoff = 4.0
    retry = {"max_attempts": 3, "backoff_seconds": backoff}
    job_id = rt.submit(plan(node("f", "flaky"), retry=retry), {}).job_id
    thread, ran = run_in_thread(rt.worker)
    assert failed_once.wait(10)
    deadline = time.monotonic() + 10
    while not of_type(rt.store.list_events(job_id), "node_finished"):  # the failure recorded
        assert time.monotonic() < deadline
        time.sleep(0.01)
    recorded = time.monotonic()
    time.sleep(0.2)  # the worker is in its backoff now
    rt.worker.request_stop()
    thread.join(20)
    assert not thread.is_alive() and ran == [1]
    # the stop cut the wait short (the run did not sit out the backoff)
    assert time.monotonic() - recorded < backoff - 0.5
    assert rt.get_job(job_id).status == "running"

    assert second_worker(rt, ToolRegistry([tool])).run(until_idle=True) == 1
    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert job.output == {"f": {"attempt": 2}}  # the attempts count on from the recorded one
    assert calls.count(name="flaky") == 2
    events = assert_log_sound(rt.store, job_id)
    results = [p["result_type"] for p in of_type(events, "node_finished")]
    assert results == ["retryable_failure", "side_effect_committed"]
    # ... and the next worker sat out the rest of the backoff before trying again
    failed_at = datetime.fromisoformat(of_type(events, "node_finished")[0]["at"])
    second_try = datetime.fromisoformat(of_type(events, "node_started")[1]["at"])
    assert (second_try - failed_at).total_seconds() >= backoff


def test_stop_with_step_concurrency_lets_every_running_step_finish(
    open_runtime: Any, calls: Calls
) -> None:
    left, right = Gate(calls, "left"), Gate(calls, "right")
    tools = (left.tool(), right.tool(), charge_tool(calls))
    rt = open_runtime(*tools, step_concurrency=2)
    flow = plan(
        node("l", "left"),
        node("r", "right"),
        node("c", "charge", deps=["l", "r"]),
    )
    job_id = rt.submit(flow, {}).job_id
    thread, ran = run_in_thread(rt.worker)
    assert left.inside.wait(10) and right.inside.wait(10)
    rt.worker.request_stop()
    left.open.set()
    time.sleep(0.2)  # "left" commits while "right" still runs; the run must wait for both
    assert thread.is_alive()
    right.open.set()
    thread.join(20)
    assert not thread.is_alive() and ran == [1]
    assert sorted(r.status for r in ledger_rows(rt.store, job_id)) == ["committed", "committed"]
    assert calls.count(name="charge") == 0

    assert second_worker(rt, ToolRegistry(tools)).run(until_idle=True) == 1
    assert rt.get_job(job_id).status == "completed"
    assert [calls.count(name=n) for n in ("left", "right", "charge")] == [1, 1, 1]
    assert_log_sound(rt.store, job_id)


def test_a_step_that_fails_while_stopping_still_fails_the_job(
    open_runtime: Any, calls: Calls
) -> None:
    """A stop does not hide a permanent failure of a step that was running: the job fails
    (and is sealed) instead of being handed back to run the failed step again."""
    left = Gate(calls, "left")

    def broken(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "broken")
        # fail only once "left" has committed: the run has seen the stop by then
        deadline = time.monotonic() + 30
        while "committed" not in {r.status for r in ledger_rows(rt.store, ctx.job_id)}:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.1)
        raise ValueError("card declined")

    rt = open_runtime(left.tool(), Tool("broken", broken, "tool"), step_concurrency=2)
    job_id = rt.submit(plan(node("l", "left"), node("b", "broken")), {}).job_id
    statuses: list[str] = []
    rt.worker.on_job = lambda job, status, seconds: statuses.append(status)
    thread, ran = run_in_thread(rt.worker)
    assert left.inside.wait(10)
    rt.worker.request_stop()
    left.open.set()
    thread.join(20)
    assert not thread.is_alive() and ran == [1]
    assert statuses == ["failed"]
    assert rt.get_job(job_id).status == "failed"
    assert verify_job(rt.store, job_id).ok


def test_a_stopped_worker_claims_nothing(open_runtime: Any, calls: Calls) -> None:
    rt = open_runtime(charge_tool(calls))
    job_id = rt.submit(plan(node("c", "charge")), {}).job_id
    rt.worker.request_stop()
    assert rt.worker.stopping
    assert rt.worker.run() == 0  # returns at once instead of polling
    assert rt.get_job(job_id).status == "pending"
    assert calls.count() == 0
