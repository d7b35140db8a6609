"""Unit-level runtime tests, on SQLite and PostgreSQL: retries, failures, compensation, cancel,
resume, idempotent submit, bad input, in-process crash recovery and replay determinism.

Tools are built as :class:`Tool` objects in each test (not with the decorators, which would
register them in the process-wide registry) and count their real calls in a list.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import affidavit.core.crash as crash_module
from affidavit import (
    CanonicalizationError,
    CompensatableError,
    PlanError,
    RetryableError,
    Runtime,
    Tool,
    ToolContext,
    ToolRegistry,
)
from affidavit.core.errors import ConfigError, IdempotencyConflict
from affidavit.core.plan import Plan, idempotency_key
from affidavit.record._args import ArgsResolutionError
from affidavit.record._replay import build_from_events
from affidavit.record._trace import job_trace
from affidavit.runtime._journal import Journal, RunControl
from affidavit.runtime._runtime import InvalidStateError
from affidavit.runtime._sdk import ToolError
from affidavit.runtime._worker import Worker
from affidavit.store import JobFilter
from affidavit.verify import verify_job
from tests.runtime.helpers import (
    Calls,
    SimulatedCrash,
    assert_log_sound,
    ledger_rows,
    node,
    of_type,
    plan,
    wait_lease_expired,
)

LEASE = 0.4  # short: tests that simulate a crash wait for it to run out


@pytest.fixture
def make_runtime(store_url: str) -> Iterator[Callable[..., Runtime]]:
    opened: list[Runtime] = []

    def make(*tools: Tool, lease_seconds: float = LEASE, sleep: Any = None) -> Runtime:
        registry = ToolRegistry(tools)
        rt = Runtime(store_url, tools=registry, lease_seconds=lease_seconds)
        if sleep is not None:
            rt.worker = Worker(rt.store, registry, lease_seconds=lease_seconds, sleep=sleep)
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``crash_at("tool.after_acquire")``: the next time a runner reaches that point, it
    "dies" there (see :class:`SimulatedCrash`)."""

    def arm(point: str) -> None:
        armed = [True]

        def crash_point(name: str) -> None:
            if name == point and armed[0]:
                armed[0] = False
                raise SimulatedCrash(name)

        monkeypatch.setattr(crash_module, "crash_point", crash_point)

    return arm


def charge_tool(calls: Calls, name: str = "charge", **kw: Any) -> Tool:
    def fn(ctx: ToolContext, amount: int = 1) -> dict[str, Any]:
        calls.add(ctx, name)
        return {"charged": amount, "key": ctx.external_key}

    return Tool(name, fn, "tool", **kw)


def double_tool(calls: Calls) -> Tool:
    def fn(ctx: ToolContext, value: dict[str, Any]) -> dict[str, Any]:
        calls.add(ctx, "double")
        return {"amount": value["charged"] * 2}

    return Tool("double", fn, "pure")


def flaky_tool(calls: Calls, fail_times: int, exc: Callable[[], BaseException], **kw: Any) -> Tool:
    def fn(ctx: ToolContext, amount: int = 1) -> dict[str, Any]:
        calls.add(ctx, "flaky")
        if calls.count(name="flaky") <= fail_times:
            raise exc()
        return {"ok": amount, "key": ctx.external_key}

    return Tool("flaky", fn, "tool", **kw)


CHAIN = plan(
    node("a", "charge", args={"amount": "${input.amount}"}),
    node("b", "double", "pure", args={"value": "${a}"}, deps=["a"]),
    node("c", "charge", args={"amount": "${b.amount}"}, deps=["b"]),
)


def finished_nodes(events: Any, node_id: str) -> list[tuple[str, int]]:
    return [
        (p["result_type"], p["attempt"])
        for p in of_type(events, "node_finished")
        if p["node_id"] == node_id
    ]


def crash_and_wait(rt: Runtime, job_id: str) -> None:
    with pytest.raises(SimulatedCrash):
        rt.run_until_idle()
    assert rt.get_job(job_id).status == "running"
    wait_lease_expired(rt.store, job_id)


# --- the happy path and re-runs ---------------------------------------------------------------


def test_job_runs_each_step_once_and_never_again(make_runtime: Any, calls: Calls) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = rt.submit(CHAIN, {"amount": 5}).job_id
    assert rt.run_until_idle() == 1
    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert job.output == {"c": {"charged": 10, "key": calls.log[-1][3]}}
    assert [(n, node) for n, node, _, _ in calls.log] == [
        ("charge", "a"),
        ("double", "b"),
        ("charge", "c"),
    ]
    events = assert_log_sound(rt.store, job_id)
    assert [r.status for r in ledger_rows(rt.store, job_id)] == ["committed", "committed"]

    # Running it again — by the idle loop, by id, by a fresh worker — executes nothing.
    assert rt.run_until_idle() == 0
    assert rt.run_job(job_id).status == "completed"
    assert Worker(rt.store, rt.tools, lease_seconds=LEASE).run(until_idle=True) == 0
    assert len(calls.log) == 3
    assert rt.store.list_events(job_id) == events


def test_a_ledger_row_the_log_does_not_show_is_read_never_overwritten(
    make_runtime: Any, calls: Calls
) -> None:
    """A step the log never started has its ledger insert presumed new (on PostgreSQL sent
    unanswered, with the started events and the commit). If the key's row is there after all,
    that first T1 writes nothing and runs again reading the row: a committed result is
    returned, the tool is not called."""
    rt = make_runtime(charge_tool(calls))
    job_id = rt.submit(plan(node("a", "charge", args={"amount": 3})), {}).job_id
    step = Plan.parse(plan(node("a", "charge", args={"amount": 3}))).step_ids(job_id)["a"]
    key = idempotency_key(job_id, step, "charge", {"amount": 3})
    with rt.store.transaction() as tx:
        assert tx.ledger_insert(
            job_id=job_id,
            key=key,
            node_id="a",
            step_id=step,
            tool_name="charge",
            args_hash="-",
            invocation_id="inv-by-hand",
            attempt_id=None,
        )
        tx.ledger_finish(job_id, key, status="committed", result={"charged": 3, "key": "x"})
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert (job.status, job.output) == ("completed", {"a": {"charged": 3, "key": "x"}})
    assert calls.log == []


def test_committed_step_is_not_retried_when_a_later_step_retries(
    make_runtime: Any, calls: Calls
) -> None:
    rt = make_runtime(charge_tool(calls), flaky_tool(calls, 2, lambda: RetryableError("503")))
    job_id = rt.submit(plan(node("a", "charge"), node("b", "flaky", deps=["a"])), {}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    assert calls.count("a") == 1
    assert calls.count("b") == 3
    assert_log_sound(rt.store, job_id)


# --- retries --------------------------------------------------------------------------------


def test_a_long_retry_backs_off_at_most_a_minute_past_attempt_1024(
    make_runtime: Any, calls: Calls
) -> None:
    """The backoff doubles up to its 60 s cap; past attempt 1024 the doubling is past any
    float, and the cap still holds (the run does not end in an OverflowError and leave the
    job to be reclaimed, only to end the same way)."""
    waits: list[float] = []
    rt = make_runtime(flaky_tool(calls, 1030, lambda: RetryableError("503")), sleep=waits.append)
    job_id = rt.submit(
        plan(node("f", "flaky"), retry={"max_attempts": 1031, "backoff_seconds": 0.5}), {}
    ).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    assert calls.count("f") == 1031
    assert waits[:8] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert len(waits) == 1030 and set(waits[7:]) == {60.0}


def test_retryable_failure_then_success(make_runtime: Any, calls: Calls) -> None:
    seen_between: list[str] = []
    holder: list[Runtime] = []

    def backoff(seconds: float) -> None:  # called between the tries: look at the ledger then
        [row] = ledger_rows(holder[0].store, job_id)
        seen_between.append(row.status)

    rt = make_runtime(flaky_tool(calls, 1, lambda: RetryableError("try again")), sleep=backoff)
    holder.append(rt)
    job_id = rt.submit(
        plan(
            node("f", "flaky", args={"amount": 3}),
            retry={"max_attempts": 3, "backoff_seconds": 0.01},
        ),
        {},
    ).job_id
    rt.run_until_idle()

    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert job.output == {"f": {"ok": 3, "key": calls.log[1][3]}}
    assert calls.count("f") == 2
    assert seen_between == ["failed"]  # the failed try left the row failed, not committed
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "committed" and row.tries == 2 and row.result == job.output["f"]

    events = assert_log_sound(rt.store, job_id)
    assert finished_nodes(events, "f") == [("retryable_failure", 1), ("side_effect_committed", 2)]
    started = of_type(events, "tool_invocation_started")
    assert [s["attempt"] for s in started] == [1, 2]
    assert len({s["idempotency_key"] for s in started}) == 1  # one step, one key
    assert [f["outcome"] for f in of_type(events, "tool_invocation_finished")] == [
        "failure",
        "success",
    ]
    # within one claim a retry reuses the external key (a deduplicating API absorbs it)
    assert [a for _, _, a, _ in calls.log] == [1, 2]
    assert calls.log[0][3] == calls.log[1][3]


def test_a_tool_that_changes_its_args_changes_nothing_else(make_runtime: Any, calls: Calls) -> None:
    """Each try, and the compensation, gets the resolved args as recorded (their hash is in the
    log), and the input and upstream outputs a later step reads stay as recorded."""
    seen: list[list[int]] = []
    undone: list[list[int]] = []

    def grab(ctx: ToolContext, items: list[int]) -> dict[str, Any]:
        calls.add(ctx, "grab")
        seen.append(list(items))
        items.append(99)
        if ctx.attempt == 1:
            raise RetryableError("again")
        if ctx.node_id == "undo":
            raise CompensatableError("half done")
        return {"n": len(items)}

    def compensate(ctx: ToolContext, items: list[int]) -> dict[str, Any]:
        undone.append(list(items))
        items.clear()
        return {"undone": True}

    def echo(ctx: ToolContext, items: list[int]) -> list[int]:
        return items

    rt = make_runtime(
        Tool("grab", grab, "tool", compensate_fn=compensate), Tool("echo", echo, "pure")
    )
    job_id = rt.submit(
        plan(
            node("g", "grab", args={"items": "${input.items}"}),
            node("e", "echo", "pure", args={"items": "${input.items}"}, deps=["g"]),
        ),
        {"items": [1]},
    ).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert seen == [[1], [1]]  # the retry got the args its key and args_hash were made from
    assert job.output == {"e": [1]}  # the input was not changed under a later step
    assert verify_job(rt.store, job_id).ok

    seen.clear()
    job_id = rt.submit(plan(node("undo", "grab", args={"items": [1]})), {}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "failed"
    assert seen == [[1], [1]] and undone == [[1]]
    assert_log_sound(rt.store, job_id)
    assert verify_job(rt.store, job_id).ok


def test_retry_on_and_tool_level_max_attempts(make_runtime: Any, calls: Calls) -> None:
    rt = make_runtime(
        flaky_tool(calls, 5, lambda: ConnectionError("reset"), retry=2, retry_on=(ConnectionError,))
    )
    job_id = rt.submit(plan(node("f", "flaky")), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert calls.count("f") == 2  # the tool's own limit, not the plan's 3
    assert job.error == {"type": "ConnectionError", "message": "reset"}
    events = assert_log_sound(rt.store, job_id)
    assert finished_nodes(events, "f") == [("retryable_failure", 1), ("retryable_failure", 2)]
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "failed" and row.tries == 2


def test_retry_on_a_type_that_is_not_an_exception(make_runtime: Any, calls: Calls) -> None:
    """``retry_on`` takes any exception type: a cancelled asyncio call inside a tool raises
    ``CancelledError``, a ``BaseException``; listed, it is retried like any other."""
    rt = make_runtime(
        flaky_tool(calls, 1, asyncio.CancelledError, retry_on=(asyncio.CancelledError,))
    )
    job_id = rt.submit(plan(node("f", "flaky")), {}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    assert calls.count("f") == 2
    events = assert_log_sound(rt.store, job_id)
    assert finished_nodes(events, "f") == [("retryable_failure", 1), ("side_effect_committed", 2)]
    assert verify_job(rt.store, job_id).ok


def test_retries_exhausted_fail_the_job(make_runtime: Any, calls: Calls) -> None:
    rt = make_runtime(flaky_tool(calls, 99, lambda: RetryableError("still down")))
    job_id = rt.submit(plan(node("f", "flaky")), {}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "failed"
    assert calls.count("f") == 3
    events = assert_log_sound(rt.store, job_id)
    [failed] = of_type(events, "job_failed")
    assert failed["node_id"] == "f" and failed["error"]["message"] == "still down"


def test_timeout_is_retried(make_runtime: Any, calls: Calls) -> None:
    """A tool declared idempotent is tried again after a timeout (tests/runtime/
    test_call_timeouts.py: the tools that are not)."""
    release = threading.Event()

    def slow(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "slow")
        if calls.count(name="slow") == 1:
            release.wait(5)  # the first try hangs past its timeout
        return {"done": True}

    rt = make_runtime(Tool("slow", slow, "tool", idempotent=True))
    raw = node("s", "slow")
    raw["timeout_seconds"] = 0.2
    job_id = rt.submit(plan(raw), {}).job_id
    try:
        rt.run_until_idle()
    finally:
        release.set()
    assert rt.get_job(job_id).status == "completed"
    events = assert_log_sound(rt.store, job_id)
    assert [f["outcome"] for f in of_type(events, "tool_invocation_finished")] == [
        "timeout",
        "success",
    ]


# --- permanent failure and compensation -------------------------------------------------------


def test_permanent_failure_fails_the_job(make_runtime: Any, calls: Calls) -> None:
    rt = make_runtime(
        charge_tool(calls), flaky_tool(calls, 99, lambda: ValueError("card declined"))
    )
    job_id = rt.submit(plan(node("f", "flaky"), node("after", "charge", deps=["f"])), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error == {"type": "ValueError", "message": "card declined"}
    assert calls.count("f") == 1  # a permanent failure is not retried
    assert calls.count("after") == 0
    events = assert_log_sound(rt.store, job_id)
    [failed] = of_type(events, "job_failed")
    assert failed == {**failed, "node_id": "f", "error": job.error}
    assert finished_nodes(events, "f") == [("permanent_failure", 1)]
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "failed" and row.error == job.error
    assert rt.run_until_idle() == 0 and calls.count("f") == 1


def make_compensatable(calls: Calls, compensate: Callable[..., Any] | None) -> Tool:
    def book(ctx: ToolContext, seats: int) -> dict[str, Any]:
        calls.add(ctx, "book")
        raise CompensatableError(f"booked {seats - 1} of {seats} seats")

    return Tool("book", book, "tool", compensate_fn=compensate)


def test_compensation(make_runtime: Any, calls: Calls) -> None:
    undone: list[dict[str, Any]] = []

    def undo(ctx: ToolContext, seats: int) -> dict[str, Any]:
        undone.append({"key": ctx.idempotency_key, "seats": seats})
        return {"released": seats - 1}

    rt = make_runtime(make_compensatable(calls, undo), charge_tool(calls))
    job_id = rt.submit(
        plan(node("book", "book", args={"seats": 3}), node("pay", "charge", deps=["book"])), {}
    ).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error == {"type": "CompensatableError", "message": "booked 2 of 3 seats"}
    assert calls.count("book") == 1 and calls.count("pay") == 0  # not retried, not continued
    events = assert_log_sound(rt.store, job_id)
    [compensated] = of_type(events, "step_compensated")
    assert compensated["node_id"] == "book" and compensated["compensation"] == {"released": 2}
    assert len(undone) == 1 and undone[0]["seats"] == 3
    assert undone[0]["key"] == of_type(events, "tool_invocation_started")[0]["idempotency_key"]
    assert finished_nodes(events, "book") == [("compensatable_failure", 1), ("compensated", 1)]
    # FORMATS §3: a tool node's node_finished carries no output (the compensation is above)
    assert all("output" not in f for f in of_type(events, "node_finished"))
    assert of_type(events, "job_failed")[0]["node_id"] == "book"
    types = [e.type for e in events]
    assert types.index("step_compensated") < types.index("job_failed")
    assert rt.run_until_idle() == 0 and calls.count("book") == 1


def test_compensation_that_fails_or_is_missing(make_runtime: Any, calls: Calls) -> None:
    def broken_undo(ctx: ToolContext, seats: int) -> None:
        raise RuntimeError("undo API down")

    rt = make_runtime(make_compensatable(calls, broken_undo))
    job_id = rt.submit(plan(node("book", "book", args={"seats": 2})), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error["type"] == "compensation_failed"
    assert "'book'" in job.error["message"] and "undo API down" in job.error["message"]
    events = assert_log_sound(rt.store, job_id)
    assert not of_type(events, "step_compensated")

    rt2 = make_runtime(make_compensatable(calls, None))
    job2 = rt2.submit(plan(node("book", "book", args={"seats": 2})), {}).job_id
    rt2.run_until_idle()
    assert rt2.get_job(job2).status == "failed"
    events2 = assert_log_sound(rt2.store, job2)
    assert finished_nodes(events2, "book") == [("compensatable_failure", 1)]
    assert not of_type(events2, "step_compensated")


# --- cancel ---------------------------------------------------------------------------------


def test_cancel_pending_job(make_runtime: Any, calls: Calls) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = rt.submit(CHAIN, {"amount": 1}).job_id
    job = rt.cancel(job_id, reason="changed my mind", by="alice")
    assert job.status == "cancelled"
    assert rt.run_until_idle() == 0
    assert calls.log == []
    events = assert_log_sound(rt.store, job_id)
    [cancelled] = of_type(events, "job_cancelled")
    assert cancelled["reason"] == "changed my mind" and cancelled["by"] == "alice"
    with pytest.raises(InvalidStateError):
        rt.cancel(job_id)
    assert len(rt.store.list_events(job_id)) == len(events)


def park_in_flight(rt: Runtime, crash_at: Any, plan_dict: dict[str, Any]) -> str:
    """Submit, "crash" after T1 of the first tool step, recover: the job parks in flight."""
    job_id = rt.submit(plan_dict, {"amount": 4}).job_id
    crash_at("tool.after_acquire")
    crash_and_wait(rt, job_id)
    assert rt.run_until_idle() == 1
    assert rt.get_job(job_id).status == "parked"
    return job_id


def test_cancel_job_parked_in_flight(make_runtime: Any, calls: Calls, crash_at: Any) -> None:
    """A job parked on an invocation in flight is not cancelled over it: the cancel is a
    request, the park stands and nothing is closed; once a person resolves the park the job
    ends cancelled without running anything. ``force`` abandons the call as ``unknown``."""
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = park_in_flight(rt, crash_at, CHAIN)
    assert calls.log == []
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "started"

    assert rt.cancel(job_id, by="ops").status == "parked"
    events = assert_log_sound(rt.store, job_id)
    assert of_type(events, "tool_invocation_finished") == []
    assert rt.resume(job_id, "retry", by="ops").status == "pending"  # a person: it never ran
    assert rt.run_until_idle() == 1 and calls.log == []  # the retry does not start
    assert rt.get_job(job_id).status == "cancelled"
    events = assert_log_sound(rt.store, job_id)
    [closed] = of_type(events, "tool_invocation_finished")
    assert (closed["outcome"], closed["invocation_id"]) == ("lost", row.invocation_id)
    assert of_type(events, "job_cancelled")[0]["by"] == "ops"


def test_cancel_force_job_parked_in_flight(make_runtime: Any, calls: Calls, crash_at: Any) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = park_in_flight(rt, crash_at, CHAIN)
    [row] = ledger_rows(rt.store, job_id)
    assert rt.cancel(job_id, by="ops", force=True).status == "cancelled"
    events = assert_log_sound(rt.store, job_id)  # closing rule: the open invocation is closed
    [closed] = of_type(events, "tool_invocation_finished")
    assert closed["outcome"] == "unknown" and closed["catch_up"] is True
    assert closed["invocation_id"] == row.invocation_id
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "failed"
    assert rt.run_until_idle() == 0 and calls.log == []


def _slow_job(make_runtime: Any, calls: Calls) -> tuple[Any, str, threading.Event, Any]:
    inside, release = threading.Event(), threading.Event()

    def slow(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "slow")
        inside.set()
        release.wait(10)
        return {"late": True}

    rt = make_runtime(Tool("slow", slow, "tool"), lease_seconds=5)
    job_id = rt.submit(plan(node("s", "slow")), {}).job_id
    return rt, job_id, inside, release


def test_cancel_lets_the_running_call_finish(make_runtime: Any, calls: Calls) -> None:
    """Cancel while a worker is inside a tool: the call finishes and is committed with its
    result, then the job ends cancelled (not completed)."""
    rt, job_id, inside, release = _slow_job(make_runtime, calls)
    result: list[str | None] = []
    t = threading.Thread(target=lambda: result.append(rt.worker.run_once(job_id)))
    t.start()
    assert inside.wait(10)
    assert rt.cancel(job_id, by="ops").status == "running"
    release.set()
    t.join(10)
    assert result == ["cancelled"]
    assert rt.get_job(job_id).status == "cancelled"
    [row] = ledger_rows(rt.store, job_id)
    assert (row.status, row.result) == ("committed", {"late": True})
    events = assert_log_sound(rt.store, job_id)
    assert [p["outcome"] for p in of_type(events, "tool_invocation_finished")] == ["success"]
    assert events[-1].type == "job_cancelled"


def test_cancel_force_revokes_the_running_workers_lease(make_runtime: Any, calls: Calls) -> None:
    """Cancel --force while a worker is inside a tool: the worker can commit nothing
    afterwards, and the call is recorded as unknown (it may have acted), never as lost."""
    rt, job_id, inside, release = _slow_job(make_runtime, calls)
    result: list[str | None] = []
    t = threading.Thread(target=lambda: result.append(rt.worker.run_once(job_id)))
    t.start()
    assert inside.wait(10)
    rt.cancel(job_id, by="ops", force=True)
    after_cancel = rt.store.list_events(job_id)
    release.set()
    t.join(10)
    assert result == ["lost"]
    assert rt.get_job(job_id).status == "cancelled"
    assert rt.store.list_events(job_id) == after_cancel  # the stale T2 was fenced off
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "failed"
    events = assert_log_sound(rt.store, job_id)
    assert [p["outcome"] for p in of_type(events, "tool_invocation_finished")] == ["unknown"]


# --- resume ---------------------------------------------------------------------------------


def test_resume_fail_and_bad_decisions(make_runtime: Any, calls: Calls, crash_at: Any) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = park_in_flight(rt, crash_at, CHAIN)
    with pytest.raises(InvalidStateError):
        rt.resume(job_id, "maybe")
    with pytest.raises(InvalidStateError):
        rt.resume(job_id, "accept_result")  # needs the effect's result
    with pytest.raises(CanonicalizationError):
        rt.resume(job_id, "accept_result", result={"x": {1}})
    with pytest.raises(CanonicalizationError, match="nested too deeply"):
        rt.resume(job_id, "accept_result", result=nested_lists(253))
    assert rt.get_job(job_id).status == "parked"

    job = rt.resume(job_id, "fail", by="ops", note="refunded by hand")
    assert job.status == "failed"
    assert "in flight or lost" in job.error["message"]
    events = assert_log_sound(rt.store, job_id)
    [resumed] = of_type(events, "job_resumed")
    assert resumed["decision"] == "fail" and resumed["by"] == "ops"
    assert finished_nodes(events, "a") == [("permanent_failure", 1)]
    assert rt.run_until_idle() == 0 and calls.log == []
    with pytest.raises(InvalidStateError):
        rt.resume(job_id, "retry")  # not parked any more


def test_resume_retry_and_accept_result(make_runtime: Any, calls: Calls, crash_at: Any) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    retried = park_in_flight(rt, crash_at, CHAIN)
    rt.resume(retried, "retry")
    rt.run_until_idle()
    assert rt.get_job(retried).status == "completed"
    assert calls.count("a") == 1 and calls.count("c") == 1
    events = assert_log_sound(rt.store, retried)
    assert [f["outcome"] for f in of_type(events, "tool_invocation_finished")][:2] == [
        "lost",
        "success",
    ]
    [row_a, _] = ledger_rows(rt.store, retried)
    assert row_a.tries == 2

    calls.log.clear()
    accepted = park_in_flight(rt, crash_at, CHAIN)
    rt.resume(accepted, "accept_result", result={"charged": 4, "key": "found-by-hand"})
    rt.run_until_idle()
    job = rt.get_job(accepted)
    assert job.status == "completed"
    assert calls.count("a") == 0  # a person said it happened: never executed again
    assert calls.count("b") == 1 and calls.count("c") == 1
    assert job.output["c"]["charged"] == 8  # downstream used the accepted result
    assert_log_sound(rt.store, accepted)


def park_version(rt: Runtime, job_id: str) -> int:
    """The version of the park in force, as `jobs show` and the trace show it."""
    parked = job_trace(rt.store, job_id)["parked"]
    assert parked is not None
    version = parked["version"]
    assert isinstance(version, int)
    assert rt.store.list_events(job_id)[version - 1].type == "job_parked"
    return version


def park_again(rt: Runtime, crash_at: Any, job_id: str) -> None:
    """The parked job's tool step is retried and "crashes" in flight once more: parked again."""
    crash_at("tool.after_acquire")
    crash_and_wait(rt, job_id)
    assert rt.run_until_idle() == 1
    assert rt.get_job(job_id).status == "parked"


def test_a_resume_pinned_to_the_park_in_force_applies(
    make_runtime: Any, calls: Calls, crash_at: Any
) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = park_in_flight(rt, crash_at, CHAIN)
    first = park_version(rt, job_id)
    assert rt.resume(job_id, "retry", park_version=first).status == "pending"
    park_again(rt, crash_at, job_id)
    second = park_version(rt, job_id)
    assert second > first
    job = rt.resume(job_id, "accept_result", result={"charged": 4}, park_version=second)
    assert job.status == "pending"
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    events = assert_log_sound(rt.store, job_id)
    assert [r["decision"] for r in of_type(events, "job_resumed")] == ["retry", "accept_result"]


@pytest.mark.parametrize("decision", ["retry", "fail"])
def test_a_resume_pinned_to_an_earlier_park_is_refused_and_writes_nothing(
    make_runtime: Any, calls: Calls, crash_at: Any, decision: str
) -> None:
    """Two people looked at the first park; the first one's retry ran the job into a second
    park. The second one's decision, pinned to the first park, does not land on the new one."""
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = park_in_flight(rt, crash_at, CHAIN)
    first = park_version(rt, job_id)
    rt.resume(job_id, "retry", park_version=first)
    park_again(rt, crash_at, job_id)
    second = park_version(rt, job_id)
    before, rows = rt.store.list_events(job_id), ledger_rows(rt.store, job_id)

    with pytest.raises(InvalidStateError) as refused:
        rt.resume(job_id, decision, park_version=first)
    message = refused.value.message
    assert f"parked at version {second} for in_flight" in message
    assert f"not by the park at version {first}" in message
    assert str(second) in refused.value.hint
    assert rt.store.list_events(job_id) == before  # nothing written
    assert ledger_rows(rt.store, job_id) == rows
    job = rt.get_job(job_id)
    assert job.status == "parked" and job.version == len(before)
    with pytest.raises(InvalidStateError):
        rt.resume(job_id, decision, park_version=second + 1)  # no park there at all
    assert rt.store.list_events(job_id) == before
    assert park_version(rt, job_id) == second  # the second park still waits for a decision


def test_a_resume_pinned_to_a_park_of_a_job_no_longer_parked_is_refused(
    make_runtime: Any, calls: Calls, crash_at: Any
) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = park_in_flight(rt, crash_at, CHAIN)
    first = park_version(rt, job_id)
    rt.resume(job_id, "retry", park_version=first)  # the first person
    before = rt.store.list_events(job_id)
    with pytest.raises(InvalidStateError) as refused:
        rt.resume(job_id, "retry", park_version=first)  # the second: the job is pending now
    assert refused.value.message == (
        f"job {job_id} is pending, not parked; the park at version {first} is no longer in "
        "force: nothing was decided"
    )
    assert rt.store.list_events(job_id) == before
    assert rt.get_job(job_id).status == "pending"
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    with pytest.raises(InvalidStateError, match="is completed, not parked"):
        rt.resume(job_id, "fail", park_version=first)
    assert calls.count("a") == 1


def test_a_park_ends_with_a_cancel(make_runtime: Any, calls: Calls, crash_at: Any) -> None:
    """A job cancelled while parked is parked no more: the trace names no park (the trace
    page would print a pinned `resume` command that can only be refused) and the replay has
    no park in force."""
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = park_in_flight(rt, crash_at, CHAIN)
    first = park_version(rt, job_id)
    assert rt.cancel(job_id, force=True).status == "cancelled"
    assert job_trace(rt.store, job_id)["parked"] is None
    replay = build_from_events(rt.store.list_events(job_id))
    assert (replay.status, replay.parked, replay.parked_version) == ("cancelled", None, None)
    with pytest.raises(InvalidStateError, match="is cancelled, not parked"):
        rt.resume(job_id, "fail", park_version=first)


@pytest.mark.parametrize("bad", [0, -3, True, "5", 2.0])
def test_a_park_version_that_is_no_version_is_refused(
    make_runtime: Any, calls: Calls, crash_at: Any, bad: Any
) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = park_in_flight(rt, crash_at, CHAIN)
    before = rt.store.list_events(job_id)
    with pytest.raises(ConfigError, match="park_version must be a positive integer"):
        rt.resume(job_id, "fail", park_version=bad)
    assert rt.store.list_events(job_id) == before
    assert rt.get_job(job_id).status == "parked"


def test_in_flight_fail_policy_of_the_tool(make_runtime: Any, calls: Calls, crash_at: Any) -> None:
    rt = make_runtime(charge_tool(calls, in_flight="fail"), double_tool(calls))
    job_id = rt.submit(CHAIN, {"amount": 4}).job_id  # the plan says park; the tool says fail
    crash_at("tool.after_execute")
    crash_and_wait(rt, job_id)
    assert calls.count("a") == 1
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error["message"] == "invocation in flight or lost"
    assert calls.count("a") == 1
    assert_log_sound(rt.store, job_id)


# --- idempotent submit ----------------------------------------------------------------------


def test_duplicate_submit_returns_the_same_job_and_runs_once(
    make_runtime: Any, calls: Calls
) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    first = rt.submit(CHAIN, {"amount": 2}, idempotency_key="order-7")
    second = rt.submit(CHAIN, {"amount": 2}, idempotency_key="order-7")
    assert second.job_id == first.job_id
    assert len(rt.store.list_jobs(JobFilter())) == 1
    rt.run_until_idle()
    third = rt.submit(CHAIN, {"amount": 2}, idempotency_key="order-7")
    assert third.job_id == first.job_id and third.status == "completed"
    assert rt.run_until_idle() == 0
    assert calls.count("a") == 1 and calls.count("c") == 1
    events = assert_log_sound(rt.store, first.job_id)
    assert len(of_type(events, "job_created")) == 1
    other = rt.submit(CHAIN, {"amount": 2}, idempotency_key="order-8")
    assert other.job_id != first.job_id


def test_a_key_reused_with_another_plan_or_input_is_refused(
    make_runtime: Any, calls: Calls
) -> None:
    """The same key names the same job only for the same plan and input: a changed input or
    plan under an old key is an error (nothing written), not the old job back unnoticed."""
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    first = rt.submit(CHAIN, {"amount": 2}, idempotency_key="order-7")
    with pytest.raises(IdempotencyConflict, match="another input"):
        rt.submit(CHAIN, {"amount": 3}, idempotency_key="order-7")
    changed = {**CHAIN, "nodes": CHAIN["nodes"][:1]}  # another task graph
    with pytest.raises(IdempotencyConflict, match="another plan and input"):
        rt.submit(changed, {"amount": 3}, idempotency_key="order-7")
    assert [j.job_id for j in rt.store.list_jobs(JobFilter())] == [first.job_id]
    assert rt.store.get_job(first.job_id).version == 2
    # the same plan and input: the same job, as before
    assert rt.submit(CHAIN, {"amount": 2}, idempotency_key="order-7").job_id == first.job_id


def test_concurrent_duplicate_submits(make_runtime: Any, calls: Calls) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    ids: list[str] = []
    barrier = threading.Barrier(4)

    def submit() -> None:
        barrier.wait()
        ids.append(rt.submit(CHAIN, {"amount": 2}, idempotency_key="same").job_id)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and len(ids) == 4
    assert len(rt.store.list_jobs(JobFilter())) == 1
    rt.run_until_idle(concurrency=2)
    assert calls.count("a") == 1


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        ("", "is empty"),
        ("  ", "is blank"),
        (7, "of type int"),
        ("k" * 201, "201 characters"),
        ("order\x007", "control character"),
    ],
    ids=["empty", "blank", "not-text", "too-long", "nul"],
)
def test_an_unusable_idempotency_key_is_refused_and_writes_nothing(
    make_runtime: Any, calls: Calls, key: Any, needle: str
) -> None:
    """A key the job could not be found by again (an empty one from an unset variable, a
    number, NUL that only one backend stores) is an error before anything is written."""
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    with pytest.raises(ConfigError, match=needle):
        rt.submit(CHAIN, {"amount": 2}, idempotency_key=key)
    assert rt.store.list_jobs(JobFilter()) == []
    longest = "k" * 200
    assert rt.submit(CHAIN, {"amount": 2}, idempotency_key=longest).idempotency_key == longest


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad_plan", "needle"),
    [
        ({"nodes": []}, "non-empty"),
        ({"nodes": [node("a", "charge")], "surprise": 1}, "surprise"),
        ({"nodes": [node("a", "charge", deps=["b"]), node("b", "charge", deps=["a"])]}, "cycle"),
        ({"nodes": [node("a", "charge", deps=["ghost"])]}, "ghost"),
        ({"nodes": [node("a", "charge"), node("b", "charge", args={"x": "${a.y}"})]}, "'a'"),
        ({"nodes": [node("a", "no_such_tool")]}, "no_such_tool"),
        ({"nodes": [node("a", "charge", "pure")]}, "@tool"),
        ({"nodes": [node("a", "charge")], "in_flight": "maybe"}, "in_flight"),
    ],
    ids=[
        "empty",
        "unknown-field",
        "cycle",
        "dangling",
        "undeclared-ref",
        "unknown-tool",
        "wrong-kind",
        "bad-policy",
    ],
)
def test_invalid_plan_is_refused_and_writes_nothing(
    make_runtime: Any, calls: Calls, bad_plan: dict[str, Any], needle: str
) -> None:
    rt = make_runtime(charge_tool(calls))
    with pytest.raises(PlanError) as info:
        rt.submit(bad_plan, {})
    assert needle in info.value.message
    assert rt.store.list_jobs(JobFilter()) == []


def test_unknown_tool_names_the_node(make_runtime: Any, calls: Calls) -> None:
    rt = make_runtime(charge_tool(calls))
    with pytest.raises(PlanError) as info:
        rt.submit(plan(node("a", "charge"), node("send", "send_email", deps=["a"])), {})
    assert info.value.node_id == "send"
    assert "'send'" in info.value.message and "'send_email'" in info.value.message
    assert "charge" in info.value.hint
    assert rt.store.list_jobs(JobFilter()) == []


@pytest.mark.parametrize("bad_input", [{"x": {1, 2}}, {"b": b"raw"}, {"n": float("nan")}])
def test_non_json_input_is_refused(make_runtime: Any, calls: Calls, bad_input: Any) -> None:
    rt = make_runtime(charge_tool(calls))
    with pytest.raises(CanonicalizationError) as info:
        rt.submit(plan(node("a", "charge")), bad_input)
    assert info.value.path.startswith("$.")
    assert rt.store.list_jobs(JobFilter()) == []


@pytest.mark.parametrize("kind", ["tool", "pure"])
def test_an_ordered_dict_result_is_recorded_as_an_object(
    make_runtime: Any, calls: Calls, kind: str
) -> None:
    def ordered(ctx: ToolContext) -> Any:
        calls.add(ctx, "ordered")
        return OrderedDict(b=1, a=OrderedDict(c=[2]))

    rt = make_runtime(Tool("ordered", ordered, kind))
    job_id = rt.submit(plan(node("o", "ordered", kind)), OrderedDict(k=1)).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "completed", job.error
    assert job.output == {"o": {"a": {"c": [2]}, "b": 1}}
    assert_log_sound(rt.store, job_id)


@pytest.mark.parametrize("kind", ["tool", "pure"])
@pytest.mark.parametrize(
    "value", [{"ids": {1, 2}}, b"bytes", {"n": float("inf")}], ids=["set", "bytes", "inf"]
)
def test_non_json_result_fails_the_job_naming_the_node(
    make_runtime: Any, calls: Calls, kind: str, value: Any
) -> None:
    def returns_junk(ctx: ToolContext) -> Any:
        calls.add(ctx, "junk")
        return value

    rt = make_runtime(Tool("junk", returns_junk, kind), charge_tool(calls))
    job_id = rt.submit(
        plan(node("make_junk", "junk", kind), node("after", "charge", deps=["make_junk"])), {}
    ).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error["type"] == "CanonicalizationError"
    message = job.error["message"]
    assert f"{kind} 'junk' of node 'make_junk' returned a value that cannot be recorded" in message
    assert "not JSON" in message or "not finite" in message  # what is wrong ...
    assert message.endswith((" at $", " at $.ids", " at $.n"))  # ... and where
    assert calls.count("make_junk") == 1  # not retried: it is not a transient failure
    assert calls.count("after") == 0
    events = assert_log_sound(rt.store, job_id)
    assert of_type(events, "job_failed")[0]["node_id"] == "make_junk"
    if kind == "tool":  # the effect may have happened, but nothing unrecordable is committed
        [row] = ledger_rows(rt.store, job_id)
        assert row.status == "failed"


def nested_lists(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("kind", ["tool", "pure"])
def test_a_result_nested_too_deeply_for_the_jobs_output_fails_its_step(
    make_runtime: Any, calls: Calls, kind: str
) -> None:
    """A result 253 arrays deep fit in its own events but not in job_completed, two levels
    deeper: the step was committed, then the job could not complete — the run raised, the job
    stayed running, and every recovery raised again."""

    def deep(ctx: ToolContext, depth: int) -> Any:
        calls.add(ctx, "deep")
        return nested_lists(depth)

    rt = make_runtime(Tool("deep", deep, kind))
    fits = rt.submit(plan(node("d", "deep", kind, args={"depth": 252})), {}).job_id
    too_deep = rt.submit(plan(node("d", "deep", kind, args={"depth": 253})), {}).job_id
    rt.run_until_idle()
    assert rt.get_job(fits).status == "completed"
    assert rt.get_job(fits).output == {"d": nested_lists(252)}
    job = rt.get_job(too_deep)
    assert job.status == "failed" and job.error["type"] == "CanonicalizationError"
    assert job.error["message"] == (
        f"{kind} 'deep' of node 'd' returned a value that cannot be recorded: nested too deeply: "
        "arrays and objects may hold one another at most 252 levels deep in a value that is "
        "recorded at $"
    )
    assert calls.count("d") == 2  # once per job: not retried
    for job_id in (fits, too_deep):
        assert_log_sound(rt.store, job_id)
        assert verify_job(rt.store, job_id).ok
    if kind == "tool":
        [row] = ledger_rows(rt.store, too_deep)
        assert row.status == "failed"


def test_input_nested_too_deeply_for_its_job_is_refused_and_writes_nothing(
    make_runtime: Any, calls: Calls
) -> None:
    rt = make_runtime(charge_tool(calls))
    with pytest.raises(CanonicalizationError, match="nested too deeply"):
        rt.submit(plan(node("a", "charge")), {"doc": nested_lists(252)})
    assert rt.store.list_jobs(JobFilter()) == []


def test_non_json_result_is_not_retried_even_when_retry_on_catches_all(
    make_runtime: Any, calls: Calls
) -> None:
    def acts(ctx: ToolContext) -> Any:
        calls.add(ctx, "acts")
        return {"sent": {1, 2}}  # the tool acted, then returned a set

    rt = make_runtime(Tool("acts", acts, "tool", retry_on=(Exception,)))
    job_id = rt.submit(plan(node("a", "acts")), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed" and job.error["type"] == "CanonicalizationError"
    assert calls.count("a") == 1  # another try would act again
    events = assert_log_sound(rt.store, job_id)
    assert finished_nodes(events, "a") == [("permanent_failure", 1)]
    assert verify_job(rt.store, job_id).ok


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
@pytest.mark.parametrize("kind", ["tool", "pure"])
def test_a_function_written_without_ctx_fails_saying_so_and_is_not_retried(
    make_runtime: Any, kind: str, timed: bool
) -> None:
    """It failed with Python's "compose() got multiple values for argument 'name'". (A node
    with a timeout calls the function on a thread of its own.)"""
    entered: list[str] = []

    def compose(name: str) -> str:  # the step's context is missing
        entered.append(name)
        return name

    rt = make_runtime(Tool("compose", compose, kind, retry_on=(Exception,)))
    greet = node("greet", "compose", kind, args={"name": "Ann"})
    if timed:
        greet["timeout_seconds"] = 5
    job_id = rt.submit(plan(greet), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error["type"] == "ToolCallError"
    message = job.error["message"]
    assert message.startswith(
        "step 'greet': compose(name) cannot be called as compose(ctx, **args)"
    )
    assert "with args (name): multiple values for argument 'name'" in message
    assert message.endswith(
        "the first parameter takes the step's context: def compose(ctx, name, ...)"
    )
    assert entered == []
    events = assert_log_sound(rt.store, job_id)
    assert finished_nodes(events, "greet") == [("permanent_failure", 1)]  # not retried
    if kind == "tool":  # the tool did not run: its invocation failed, nothing committed
        [row] = ledger_rows(rt.store, job_id)
        assert row.status == "failed"
    assert verify_job(rt.store, job_id).ok


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ({"amount": 1, "currency": "EUR"}, "got an unexpected keyword argument 'currency'"),
        ({}, "missing a required argument: 'amount'"),
    ],
    ids=["one-too-many", "one-missing"],
)
def test_args_that_do_not_fit_the_function_name_its_parameters(
    make_runtime: Any, calls: Calls, args: dict[str, Any], reason: str
) -> None:
    def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.add(ctx, "pay")
        return {"paid": amount}

    rt = make_runtime(Tool("pay", pay, "tool"))
    job_id = rt.submit(plan(node("p", "pay", args=args)), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed" and job.error["type"] == "ToolCallError"
    given = ", ".join(args) or "none"
    assert job.error["message"] == (
        f"step 'p': pay(ctx, amount) cannot be called as pay(ctx, **args) with args ({given}): "
        f"{reason}"
    )
    assert calls.count("p") == 0


def test_a_type_error_raised_inside_a_function_is_recorded_as_it_is(
    make_runtime: Any, calls: Calls
) -> None:
    """Only a call that does not fit is a ToolCallError: a TypeError from the function's own
    code keeps its type and message, and retry_on retries it."""

    def adds(ctx: ToolContext, amount: int) -> int:
        calls.add(ctx, "adds")
        return amount + "1"  # type: ignore[operator]

    rt = make_runtime(Tool("adds", adds, "tool", retry_on=(TypeError,)))
    job_id = rt.submit(plan(node("a", "adds", args={"amount": 1})), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error == {
        "type": "TypeError",
        "message": "unsupported operand type(s) for +: 'int' and 'str'",
    }
    assert calls.count("a") == 3  # the plan's max_attempts


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


@pytest.mark.parametrize(
    ("kind", "raised", "message"),
    [
        ("pure", ValueError("no file 'caf\udce9'"), "no file 'caf\\udce9'"),
        ("tool", OSError("no file 'caf\udce9'"), "no file 'caf\\udce9'"),
        ("tool", _Unprintable(), "(the exception's message could not be read)"),
    ],
    ids=["pure-surrogate", "tool-surrogate", "tool-unprintable"],
)
def test_an_error_whose_message_is_not_text_is_recorded(
    make_runtime: Any, calls: Calls, kind: str, raised: Exception, message: str
) -> None:
    """A failure that could not be recorded left the job running: a pure step ran again on
    every pickup, a tool step was found in flight."""

    def fails(ctx: ToolContext) -> Any:
        calls.add(ctx, "fails")
        raise raised

    rt = make_runtime(Tool("fails", fails, kind))
    job_id = rt.submit(plan(node("f", "fails", kind)), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error == {"type": type(raised).__name__, "message": message}
    assert calls.count("f") == 1
    assert_log_sound(rt.store, job_id)
    assert verify_job(rt.store, job_id).ok


def _compensation_raises(ctx: ToolContext, seats: int) -> Any:
    raise OSError("no file 'caf\udce9'")


def _compensation_without_args(ctx: ToolContext) -> Any:  # the node's args (seats) are missing
    return {"undone": True}


@pytest.mark.parametrize(
    ("compensate", "message"),
    [
        (_compensation_raises, "no file 'caf\\udce9'"),
        (
            _compensation_without_args,
            "step 'b': _compensation_without_args(ctx) cannot be called as "
            "_compensation_without_args(ctx, **args) with args (seats): got an unexpected "
            "keyword argument 'seats'",
        ),
    ],
    ids=["message-not-text", "written-without-the-args"],
)
def test_a_compensation_that_fails_is_recorded_with_its_message(
    make_runtime: Any, calls: Calls, compensate: Callable[..., Any], message: str
) -> None:
    rt = make_runtime(make_compensatable(calls, compensate))
    job_id = rt.submit(plan(node("b", "book", args={"seats": 2})), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error == {
        "type": "compensation_failed",
        "message": f"compensation of 'b' failed: {message}",
    }
    assert calls.count("b") == 1
    assert_log_sound(rt.store, job_id)
    assert verify_job(rt.store, job_id).ok


def test_run_until_idle_on_a_closed_runtime_is_refused(make_runtime: Any, calls: Calls) -> None:
    """Not an endless loop logging that every claim failed."""
    rt = make_runtime(charge_tool(calls))
    rt.submit(plan(node("charge", "charge")), {})
    rt.close()
    outcome: list[BaseException | int] = []

    def run() -> None:
        try:
            outcome.append(rt.run_until_idle())
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive(), "run_until_idle on a closed runtime did not return"
    [error] = outcome
    assert isinstance(error, InvalidStateError)
    assert "closed" in error.message
    assert calls.count("charge") == 0


def test_every_method_of_a_closed_runtime_says_it_is_closed(
    make_runtime: Any, calls: Calls
) -> None:
    rt = make_runtime(charge_tool(calls))
    job_id = rt.submit(plan(node("charge", "charge")), {}).job_id
    rt.close()
    for call in (
        lambda: rt.submit(plan(node("charge", "charge")), {}),
        lambda: rt.get_job(job_id),
        lambda: rt.run_job(job_id),
        lambda: rt.wait(job_id, timeout=1),
        lambda: rt.signal(job_id, "k"),
        lambda: rt.cancel(job_id),
        lambda: rt.resume(job_id, "retry"),
    ):
        with pytest.raises(InvalidStateError, match="this Runtime is closed"):
            call()
    assert calls.count("charge") == 0


@pytest.mark.parametrize(
    ("change", "what"),
    [
        (("row", 123, "update"), "resource_id must be a string"),
        (("row", "r1", None), "operation must be a string"),
        (("row", "r1", "update", None, float("nan")), "etag must be a string"),
        (("row", "r1", "update", float("nan")), "not finite at $.version"),
        (("row", "r1", "update", 2**60), "outside ±(2^53-1) at $.version"),
    ],
    ids=["int-id", "no-operation", "nan-etag", "nan-version", "huge-version"],
)
def test_unrecordable_state_change_fails_the_step_not_the_run(
    make_runtime: Any, calls: Calls, change: tuple[Any, ...], what: str
) -> None:
    """A state change that cannot be recorded is refused where the tool records it: the step
    fails naming it, the job fails, and no run is left holding an open invocation."""

    def records(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "records")
        ctx.record_state_change(*change)
        return {"ok": True}

    rt = make_runtime(Tool("records", records, "tool"))
    job_id = rt.submit(plan(node("write", "records")), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error["type"] == "ToolError"
    assert what in job.error["message"]
    assert calls.count("write") == 1
    events = assert_log_sound(rt.store, job_id)
    assert of_type(events, "state_changed") == []
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "failed"


@pytest.mark.parametrize("timeout", [None, 5], ids=["in-line", "timed"])
def test_a_state_change_recorded_after_the_step_is_refused(
    make_runtime: Any, calls: Calls, timeout: float | None
) -> None:
    """A change recorded once the tool has returned (from a thread it left running, or a
    context it kept) cannot reach the step's committed events: it is an error, not lost."""
    kept: list[ToolContext] = []

    def keeps(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "keeps")
        ctx.record_state_change("row", "r1", "update")
        kept.append(ctx)
        return {"ok": True}

    rt = make_runtime(Tool("keeps", keeps, "tool"))
    raw = node("write", "keeps")
    if timeout is not None:
        raw["timeout_seconds"] = timeout  # the tool runs on a thread of its own
    job_id = rt.submit(plan(raw), {}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    [ctx] = kept
    with pytest.raises(ToolError, match="step 'write' \\(attempt 1\\) is over"):
        ctx.record_state_change("row", "r2", "update")
    events = assert_log_sound(rt.store, job_id)
    [changed] = of_type(events, "state_changed")
    assert [c["resource_id"] for c in changed["state_changes"]] == ["r1"]


def test_a_pure_step_recording_a_state_change_fails(make_runtime: Any, calls: Calls) -> None:
    """A pure step's events record no state changes; one recorded there fails the step
    instead of vanishing (the work belongs in a @tool, through the ledger)."""

    def sneaky(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "sneaky")
        ctx.record_state_change("row", "r1", "update")
        return {"ok": True}

    rt = make_runtime(Tool("sneaky", sneaky, "pure"))
    job_id = rt.submit(plan(node("p", "sneaky", "pure")), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error["type"] == "ToolError"
    assert "pure step 'p' changes nothing outside" in job.error["message"]
    assert calls.count("p") == 1


def test_a_compensation_recording_a_state_change_fails(make_runtime: Any, calls: Calls) -> None:
    """A compensation says what it undid in its return value; a state change it records would
    be written nowhere, so it fails the compensation instead of vanishing."""

    def undo(ctx: ToolContext, seats: int) -> dict[str, Any]:
        ctx.record_state_change("seat", "s1", "delete")
        return {"released": seats}

    rt = make_runtime(make_compensatable(calls, undo))
    job_id = rt.submit(plan(node("book", "book", args={"seats": 3})), {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed" and job.error["type"] == "compensation_failed"
    assert "recorded from what it returns" in job.error["message"]
    events = assert_log_sound(rt.store, job_id)
    assert of_type(events, "step_compensated") == of_type(events, "state_changed") == []


def test_unresolvable_args_fail_the_job_naming_the_node(make_runtime: Any, calls: Calls) -> None:
    rt = make_runtime(charge_tool(calls))
    job_id = rt.submit(
        plan(
            node("lookup", "charge"),
            node("refund", "charge", args={"amount": "${lookup.missing}"}, deps=["lookup"]),
        ),
        {},
    ).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error["type"] == "args_unresolvable"
    assert "'refund'" in job.error["message"]
    assert "${lookup.missing}" in job.error["message"] and "'missing'" in job.error["message"]
    assert calls.count("refund") == 0
    events = assert_log_sound(rt.store, job_id)
    assert of_type(events, "job_failed")[0]["node_id"] == "refund"
    assert [r.node_id for r in ledger_rows(rt.store, job_id)] == ["lookup"]


def test_missing_input_field_is_refused_on_submit(make_runtime: Any, calls: Calls) -> None:
    """The input is known when the job is submitted: a reference to a field it lacks is a
    clear error then, and no job is written."""
    rt = make_runtime(charge_tool(calls))
    graph = plan(
        node("a", "charge", args={"amount": "${input.amount}"}),
        node("b", "charge", args={"amount": "${input.order.id}"}, deps=["a"]),
    )
    with pytest.raises(ArgsResolutionError, match=r"node 'a': \$\{input.amount\}"):
        rt.submit(graph, {})
    with pytest.raises(ArgsResolutionError, match=r"node 'b': \$\{input.order.id\}"):
        rt.submit(graph, {"amount": 1, "order": {"no": 7}})
    with pytest.raises(ArgsResolutionError, match="'input' has no field 'amount'"):
        rt.submit(graph, [1, 2])
    assert rt.store.list_jobs(JobFilter()) == []
    job_id = rt.submit(graph, {"amount": 1, "order": {"id": 7}}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    assert calls.count("a") == 1
    # checked as the runtime will read the input back: a tuple is a list there
    indexed = plan(node("a", "charge", args={"amount": "${input.amounts.1}"}))
    tupled = rt.submit(indexed, {"amounts": (1, 5)}).job_id
    rt.run_until_idle()
    assert rt.get_job(tupled).status == "completed"


def test_tool_missing_in_the_worker_leaves_the_job_for_another(
    store_url: str, calls: Calls
) -> None:
    """Submitted where the tool exists, claimed by a worker that lacks it: the job is handed
    back untouched (not failed) and not claimed by that worker again; one with the tool runs
    it at once (the lease was given back)."""
    with Runtime(store_url, tools=ToolRegistry([charge_tool(calls)])) as submitter:
        job_id = submitter.submit(plan(node("a", "charge")), {}).job_id
    with Runtime(store_url, tools=ToolRegistry([])) as worker:
        assert worker.run_until_idle() == 0
        job = worker.get_job(job_id)
        assert job.status in ("pending", "running") and job.version == 2
        assert worker.run_until_idle() == 0  # remembered: not claimed again
    assert calls.log == []
    with Runtime(store_url, tools=ToolRegistry([charge_tool(calls)])) as other:
        assert other.run_until_idle() == 1
        assert other.get_job(job_id).status == "completed"
    assert len(calls.log) == 1


# --- in-process crash recovery -----------------------------------------------------------------


def test_finished_pure_step_is_not_rerun_after_crash_before_complete(
    make_runtime: Any, calls: Calls, crash_at: Any
) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = rt.submit(CHAIN, {"amount": 3}).job_id
    crash_at("job.before_complete")
    crash_and_wait(rt, job_id)
    assert len(calls.log) == 3
    assert rt.run_until_idle() == 1
    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert [(n, node) for n, node, _, _ in calls.log] == [
        ("charge", "a"),
        ("double", "b"),
        ("charge", "c"),
    ]
    assert job.output["c"]["charged"] == 6
    events = assert_log_sound(rt.store, job_id)
    assert len(of_type(events, "job_completed")) == 1
    workers = {p["worker_id"] for p in of_type(events, "node_started")}
    assert len(workers) == 1  # the recovery run started no node at all


def test_steps_take_upstream_outputs_as_recorded(make_runtime: Any, calls: Calls) -> None:
    """A step's args come from what its upstream steps recorded, as in a run that replays the
    log — not from the objects they returned: a tuple is a list once recorded (so it can be
    indexed), and a tool result changed after it was returned changes nothing downstream."""
    kept: dict[str, Any] = {"n": 1}

    def pair(ctx: ToolContext) -> dict[str, Any]:
        return {"xs": ("a", "b")}

    def lookup(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "lookup")
        return kept

    def bump(ctx: ToolContext) -> dict[str, Any]:
        kept["n"] += 1  # changes the object `lookup` returned, after it was recorded
        return {}

    def use(ctx: ToolContext, x: str, n: int) -> dict[str, Any]:
        calls.add(ctx, "use")
        return {"x": x, "n": n}

    rt = make_runtime(
        Tool("pair", pair, "pure"),
        Tool("lookup", lookup, "tool"),
        Tool("bump", bump, "pure"),
        Tool("use", use, "tool"),
    )
    graph = plan(
        node("p", "pair", "pure"),
        node("l", "lookup"),
        node("b", "bump", "pure", deps=["l"]),
        node("u", "use", args={"x": "${p.xs.1}", "n": "${l.n}"}, deps=["p", "b"]),
    )
    job_id = rt.submit(graph, {}).job_id
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "completed", job.error
    assert job.output == {"u": {"x": "b", "n": 1}}
    events = assert_log_sound(rt.store, job_id)
    [recorded_l] = [
        f["result"] for f in of_type(events, "tool_invocation_finished") if f["node_id"] == "l"
    ]
    assert recorded_l == {"n": 1}


def test_crash_after_commit_is_not_reexecuted(
    make_runtime: Any, calls: Calls, crash_at: Any
) -> None:
    rt = make_runtime(charge_tool(calls), double_tool(calls))
    job_id = rt.submit(CHAIN, {"amount": 3}).job_id
    crash_at("tool.after_commit")
    crash_and_wait(rt, job_id)
    assert calls.count("a") == 1
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    assert [calls.count(n) for n in "abc"] == [1, 1, 1]
    assert_log_sound(rt.store, job_id)


def test_reconcile_after_in_process_crash(make_runtime: Any, calls: Calls, crash_at: Any) -> None:
    effects: dict[str, dict[str, Any]] = {}  # the outside world, by external key

    def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.add(ctx, "pay")
        effects[ctx.external_key] = {"paid": amount, "ref": ctx.external_key}
        return effects[ctx.external_key]

    def find(ctx: ToolContext, amount: int) -> dict[str, Any] | None:
        return effects.get(ctx.external_key)

    rt = make_runtime(Tool("pay", pay, "tool", reconcile_fn=find))
    job_id = rt.submit(plan(node("p", "pay", args={"amount": 9})), {}).job_id
    crash_at("tool.after_execute")
    crash_and_wait(rt, job_id)
    rt.run_until_idle()
    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert calls.count("p") == 1 and len(effects) == 1
    assert job.output == {"p": next(iter(effects.values()))}
    events = assert_log_sound(rt.store, job_id)
    [finished] = of_type(events, "tool_invocation_finished")
    assert finished["catch_up"] is True and finished["outcome"] == "success"


def test_a_reconcile_hook_that_hangs_times_out_like_its_step(
    make_runtime: Any, calls: Calls, crash_at: Any
) -> None:
    """The node's ``timeout_seconds`` bounds its reconcile hook too: a lookup that hangs is a
    failed lookup (the in-flight policy decides: here, park), not a worker held for ever
    while its heartbeats keep the job's lease alive."""
    release = threading.Event()

    def pay(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "pay")
        return {"paid": True}

    def find(ctx: ToolContext) -> dict[str, Any] | None:
        release.wait(10)
        return None

    rt = make_runtime(Tool("pay", pay, "tool", reconcile_fn=find))
    raw = node("p", "pay")
    raw["timeout_seconds"] = 0.3
    job_id = rt.submit(plan(raw), {}).job_id
    crash_at("tool.after_execute")
    crash_and_wait(rt, job_id)
    started = time.monotonic()
    rt.run_until_idle()
    release.set()
    assert time.monotonic() - started < 5
    job = rt.get_job(job_id)
    assert job.status == "parked" and calls.count("p") == 1
    [parked] = of_type(assert_log_sound(rt.store, job_id), "job_parked")
    assert parked["reason"] == "in_flight"


def test_a_compensation_that_hangs_times_out_like_its_step(make_runtime: Any, calls: Calls) -> None:
    release = threading.Event()

    def undo(ctx: ToolContext, seats: int) -> dict[str, Any]:
        release.wait(10)
        return {"released": seats}

    rt = make_runtime(make_compensatable(calls, undo))
    raw = node("book", "book", args={"seats": 3})
    raw["timeout_seconds"] = 0.3
    job_id = rt.submit(plan(raw), {}).job_id
    started = time.monotonic()
    rt.run_until_idle()
    release.set()
    assert time.monotonic() - started < 5
    job = rt.get_job(job_id)
    assert job.status == "failed" and job.error["type"] == "compensation_failed"
    assert "timed out after 0.3s" in job.error["message"]
    assert_log_sound(rt.store, job_id)


def node_attempts(events: Any, node_id: str) -> list[tuple[str, int]]:
    return [
        (e.type, e.payload["attempt"])
        for e in events
        if e.type in ("node_started", "node_finished") and e.payload["node_id"] == node_id
    ]


@pytest.mark.parametrize("how", ["reconcile_found", "in_flight_fail"])
def test_a_dead_invocation_is_decided_as_its_own_attempt(
    make_runtime: Any, calls: Calls, crash_at: Any, how: str
) -> None:
    """The catch-up of a dead attempt's effect, or its failure by the in-flight policy, is that
    attempt's outcome — numbered as its node_started (as a person's decision on it is), not as
    an attempt that never started."""
    effects: dict[str, dict[str, Any]] = {}

    def pay(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "pay")
        effects[ctx.external_key] = {"ref": ctx.external_key}
        return effects[ctx.external_key]

    def find(ctx: ToolContext) -> dict[str, Any] | None:
        return effects.get(ctx.external_key)

    found = how == "reconcile_found"
    rt = make_runtime(
        Tool("pay", pay, "tool", reconcile_fn=find if found else None, in_flight="fail")
    )
    job_id = rt.submit(plan(node("p", "pay")), {}).job_id
    crash_at("tool.after_execute")
    crash_and_wait(rt, job_id)
    rt.run_until_idle()
    assert rt.get_job(job_id).status == ("completed" if found else "failed")
    assert calls.count("p") == 1
    events = assert_log_sound(rt.store, job_id)
    assert node_attempts(events, "p") == [("node_started", 1), ("node_finished", 1)]
    assert verify_job(rt.store, job_id).ok


# --- replay -----------------------------------------------------------------------------------


def test_replay_context_is_deterministic(make_runtime: Any, calls: Calls, crash_at: Any) -> None:
    rt = make_runtime(
        charge_tool(calls),
        double_tool(calls),
        flaky_tool(calls, 1, lambda: RetryableError("blip")),
    )
    graph = plan(
        node("a", "charge", args={"amount": "${input.amount}"}),
        node("b", "double", "pure", args={"value": "${a}"}, deps=["a"]),
        node("f", "flaky", deps=["b"]),
        node("c", "charge", args={"amount": "${b.amount}"}, deps=["f"]),
    )
    job_id = park_in_flight(rt, crash_at, graph)
    rt.resume(job_id, "retry")
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"

    events = rt.store.list_events(job_id)
    first = build_from_events(events)
    second = build_from_events(events)
    third = build_from_events(rt.store.list_events(job_id))  # a fresh read of the same log
    assert first == second == third
    assert first is not second
    assert first.status == "completed"
    assert first.completed_nodes == {"a", "b", "f", "c"}
    assert first.pending_tool_invocations == {}
    assert set(first.completed_tool_invocations) == {
        r.idempotency_key for r in ledger_rows(rt.store, job_id)
    }
    assert first.node_output("b") == {"amount": 8}
    assert first.output == rt.get_job(job_id).output
    assert first.task_graph == dict(Plan.parse(graph).task_graph)
    # built from a prefix, it is the state at that point: deterministic there too
    prefix = events[: len(events) // 2]
    assert build_from_events(prefix) == build_from_events(list(prefix))


def test_lease_expiry_of_a_crashed_run_is_needed_before_reclaim(
    make_runtime: Any, calls: Calls, crash_at: Any
) -> None:
    """A job whose worker "died" is not runnable until its lease expires (until-idle does
    not wait for it), then it is."""
    rt = make_runtime(charge_tool(calls), double_tool(calls), lease_seconds=1.5)
    job_id = rt.submit(CHAIN, {"amount": 1}).job_id
    crash_at("tool.after_commit")
    with pytest.raises(SimulatedCrash):
        rt.run_until_idle()
    assert rt.get_job(job_id).lease_expires_at > time.time()
    assert rt.run_until_idle() == 0  # still leased by the dead attempt
    wait_lease_expired(rt.store, job_id)
    assert rt.run_until_idle() == 1
    assert rt.get_job(job_id).status == "completed"
    assert [calls.count(n) for n in "abc"] == [1, 1, 1]


@pytest.mark.parametrize("in_flight", ["park", "fail"])
@pytest.mark.parametrize("broken", ["raises", "non_json"])
def test_failing_reconcile_falls_back_to_the_in_flight_policy(
    make_runtime: Any, calls: Calls, crash_at: Any, in_flight: str, broken: str
) -> None:
    """A reconcile hook that raises (its API is down) or returns junk cannot tell whether the
    effect happened: the job is parked or failed by policy — the tool is not run blindly, and
    the worker survives (it used to die on every reclaim: a poison job)."""

    def pay(ctx: ToolContext) -> dict[str, Any]:
        calls.add(ctx, "pay")
        return {"paid": True}

    def lookup(ctx: ToolContext) -> Any:
        if broken == "raises":
            raise ConnectionError("payments API down")
        return {"found": {1, 2}}

    rt = make_runtime(Tool("pay", pay, "tool", reconcile_fn=lookup), charge_tool(calls))
    job_id = rt.submit(
        plan(node("p", "pay"), node("after", "charge", deps=["p"]), in_flight=in_flight), {}
    ).job_id
    crash_at("tool.after_execute")
    crash_and_wait(rt, job_id)
    assert rt.run_until_idle() == 1  # the worker does not die
    job = rt.get_job(job_id)
    assert calls.count("p") == 1 and calls.count("after") == 0
    events = assert_log_sound(rt.store, job_id)
    if in_flight == "park":
        assert job.status == "parked"
        [parked] = of_type(events, "job_parked")
        assert parked["reason"] == "in_flight" and parked["node_id"] == "p"
        assert "reconcile hook failed" in parked["detail"]["message"]
        reason = parked["detail"]["reconcile_error"]
        rt.resume(job_id, "accept_result", result={"paid": True})
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        assert calls.count("p") == 1 and calls.count("after") == 1
        assert_log_sound(rt.store, job_id)
    else:
        assert job.status == "failed"
        assert job.error["message"] == "invocation in flight or lost"
        reason = job.error["reconcile_error"]
    if broken == "raises":
        assert reason == {"type": "ConnectionError", "message": "payments API down"}
    else:
        assert reason["type"] == "CanonicalizationError" and "'p'" in reason["message"]


def test_concurrent_claim_loops_run_each_step_once(make_runtime: Any, calls: Calls) -> None:
    """Four claim loops in one worker (threads sharing one store): no job is claimed twice."""
    rt = make_runtime(charge_tool(calls), double_tool(calls), lease_seconds=10)
    job_ids = {rt.submit(CHAIN, {"amount": i}).job_id for i in range(24)}
    assert rt.run_until_idle(concurrency=4) == 24
    assert {j.job_id for j in rt.store.list_jobs(JobFilter(status=["completed"]))} == job_ids
    per_step = {(key, node) for _, node, _, key in calls.log}
    assert len(calls.log) == 24 * 3 == len(per_step)
    for job_id in job_ids:
        assert_log_sound(rt.store, job_id)


# --- what a run records, byte for byte ----------------------------------------------------------

AWKWARD = {
    "whole": 5.0,
    "tiny": 3e-7,
    "huge": 1e21,
    "fraction": 0.1,
    "negative_zero": -0.0,
    "text": 'naïve — \U0001f600 \u2028 \x07 "quoted" \\',
    "\U0001f600 key": [1, 2.5, None, True],
    "\ufb33": {"nested": [0.5, {"deep": 1e-5}]},
}


def test_recorded_payloads_are_canonical_for_awkward_values(
    make_runtime: Any, calls: Calls
) -> None:
    """Step payloads are written by a fast encoder; every stored payload must still be exactly
    JCS of its value (assert_log_sound re-canonicalizes each one), for results, pure outputs and
    state changes holding floats the fast path cannot write and keys it would sort wrongly."""

    def awkward(ctx: ToolContext, n: int) -> dict[str, Any]:
        calls.add(ctx, "awkward")
        ctx.record_state_change("file", "/tmp/\U0001f600.txt", "update", version=2.0)
        return {**AWKWARD, "n": n}

    def echo(ctx: ToolContext, value: Any) -> Any:
        return [value, 7.0, 0.25]

    rt = make_runtime(Tool("awkward", awkward, "tool"), Tool("echo", echo, "pure"))
    job_id = rt.submit(
        plan(
            node("a", "awkward", args={"n": "${input.n}"}),
            node("b", "echo", "pure", args={"value": "${a}"}, deps=["a"]),
        ),
        {"n": 3},
    ).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    events = assert_log_sound(rt.store, job_id)
    (finished,) = of_type(events, "tool_invocation_finished")
    assert finished["result"] == {**AWKWARD, "n": 3}
    (changed,) = of_type(events, "state_changed")
    assert changed["state_changes"][0]["resource_id"] == "/tmp/\U0001f600.txt"
    pure_output = next(p for p in of_type(events, "node_finished") if p["node_id"] == "b")
    assert pure_output["output"] == [{**AWKWARD, "n": 3}, 7, 0.25]
    assert verify_job(rt.store, job_id).ok


def test_a_transaction_that_does_not_commit_leaves_the_runs_version_and_head(
    store_url: str, calls: Calls
) -> None:
    """The run chains from the head it holds; a transaction rolled back after an append must
    not move it, or the next append would leave a gap the store cannot see. Nor the chain
    hashes it keeps for the job's seal."""
    registry = ToolRegistry([charge_tool(calls)])
    rt = Runtime(store_url, tools=registry, lease_seconds=30)
    try:
        job_id = rt.submit(plan(node("a", "charge")), {}).job_id
        claim = rt.worker.claim(job_id)
        assert claim is not None
        events = rt.store.list_events(job_id)
        replay = build_from_events(events)
        hashes = [bytes.fromhex(e.chain_hash) for e in events]
        journal = Journal(
            rt.store,
            claim,
            list(hashes),
            control=RunControl(job_id),
            metrics=rt.worker.metrics,
            sealer=rt.worker.sealer,
            node_type=lambda node_id: "tool",
        )
        before = (journal.version, journal.head)
        step = Plan.parse(replay.task_graph | {"name": "unit"}).step_ids(job_id)["a"]
        started = {"node_id": "a", "step_id": step, "attempt": 1, "worker_id": "w"}
        with pytest.raises(RuntimeError, match="after the append"), journal.tx(durable=False) as tx:
            journal.append(tx, ("node_started", started), fast=True)
            assert journal.version == before[0] + 1
            raise RuntimeError("after the append")
        assert (journal.version, journal.head) == before
        assert journal._hashes == hashes
        assert len(rt.store.list_events(job_id)) == len(events)
        journal.write(("node_started", started), fast=True)
        assert journal.version == len(events) + 1
        assert journal.head == bytes.fromhex(rt.store.get_job(job_id).head_hash or "")
        stored = [bytes.fromhex(e.chain_hash) for e in rt.store.list_events(job_id)]
        assert journal._hashes == stored
    finally:
        rt.close()
