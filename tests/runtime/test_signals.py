"""Human in the loop, on SQLite and PostgreSQL: wait and approval nodes, signals (right key,
wrong key, duplicate, to a finished job, concurrent), and that waiting and parked jobs hold no
lease and no worker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.approvals import operator
from affidavit.core.errors import (
    CanonicalizationError,
    JobNotFound,
    SignalPayloadError,
    SignalRejected,
)
from affidavit.runtime._decisions import signal_job
from tests.runtime.helpers import Calls, assert_log_sound, node, of_type, plan

APPROVAL = plan(
    node("quote", "quote", "pure", args={"amount": "${input.amount}"}),
    {"id": "ok", "type": "approval", "depends_on": ["quote"]},
    node("pay", "pay", args={"amount": "${quote.amount}", "approval": "${ok}"}, deps=["ok"]),
)
TWO_WAITS = plan(
    {"id": "first", "type": "wait"},
    {"id": "second", "type": "wait", "depends_on": ["first"]},
    node("echo", "echo", "pure", args={"a": "${first}", "b": "${second}"}, deps=["second"]),
)


@pytest.fixture
def rt(store_url: str, calls: Calls) -> Iterator[Runtime]:
    def quote(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.add(ctx, "quote")
        return {"amount": amount}

    def pay(ctx: ToolContext, amount: int, approval: Any) -> dict[str, Any]:
        calls.add(ctx, "pay")
        return {"paid": amount, "approval": approval}

    def echo(ctx: ToolContext, a: Any, b: Any) -> dict[str, Any]:
        calls.add(ctx, "echo")
        return {"a": a, "b": b}

    tools = ToolRegistry(
        [Tool("quote", quote, "pure"), Tool("pay", pay, "tool"), Tool("echo", echo, "pure")]
    )
    with Runtime(store_url, tools=tools, lease_seconds=5) as runtime:
        yield runtime


def waiting_job(rt: Runtime, graph: dict[str, Any] = APPROVAL) -> str:
    job_id = rt.submit(graph, {"amount": 30}).job_id
    assert rt.run_until_idle() == 1
    job = rt.get_job(job_id)
    assert job.status == "waiting"
    return job_id


def test_waiting_job_records_its_wait_and_holds_no_lease(rt: Runtime, calls: Calls) -> None:
    job_id = waiting_job(rt)
    job = rt.get_job(job_id)
    assert (job.attempt_id, job.lease_owner, job.lease_expires_at) == (None, None, None)
    events = assert_log_sound(rt.store, job_id)
    [waiting] = of_type(events, "job_waiting")
    assert waiting["node_id"] == "ok"
    assert waiting["wait_type"] == "approval"
    assert waiting["correlation_key"] == f"{job_id}:ok"
    # no worker picks a waiting job up, and nothing is run again
    assert rt.run_until_idle() == 0
    assert calls.count() == 1  # quote only


def test_signal_with_the_right_key_continues_the_job(rt: Runtime, calls: Calls) -> None:
    job_id = waiting_job(rt)
    payload = {"approved": True, "comment": "fine by me"}
    job = rt.signal(job_id, f"{job_id}:ok", payload, approver="ann")
    assert job.status == "pending"
    [done] = of_type(rt.store.list_events(job_id), "wait_completed")
    assert done == {
        "at": done["at"],
        "node_id": "ok",
        "correlation_key": f"{job_id}:ok",
        "payload": payload,
        "signalled_by": "operator:ann",
        "decided_by": [
            {
                "at": done["at"],
                "principal": "operator:ann",
                "role": "admin",
                "key_id": None,
                "approved": True,
                "comment": "fine by me",
            }
        ],
    }
    assert rt.run_until_idle() == 1
    job = rt.get_job(job_id)
    assert job.status == "completed", job.error
    # the payload is the approval node's output, which flows into the next step
    assert job.output == {"pay": {"paid": 30, "approval": payload}}
    assert (calls.count(name="quote"), calls.count(name="pay")) == (1, 1)
    [finished] = [
        f
        for f in of_type(assert_log_sound(rt.store, job_id), "node_finished")
        if f["node_id"] == "ok"
    ]
    assert finished["result_type"] == "pure" and finished["output"] == payload


def test_denied_approval_fails_the_job(rt: Runtime, calls: Calls) -> None:
    job_id = waiting_job(rt)
    rt.signal(job_id, f"{job_id}:ok", {"approved": False, "comment": "too much"}, approver="ann")
    assert rt.run_until_idle() == 1
    job = rt.get_job(job_id)
    assert job.status == "failed"
    assert job.error["type"] == "not_approved"
    assert calls.count(name="pay") == 0
    events = assert_log_sound(rt.store, job_id)
    [finished] = [f for f in of_type(events, "node_finished") if f["node_id"] == "ok"]
    assert finished["result_type"] == "permanent_failure"
    # the job's error is the recorded one (as a recovery reading the log would report it)
    assert finished["error"] == {"type": "not_approved", "message": "approval was denied"}
    assert {k: job.error[k] for k in ("type", "message")} == finished["error"]


@pytest.mark.parametrize(
    "payload",
    [
        None,
        {},
        False,
        True,
        "yes",
        [1],
        {"note": "fine"},
        {"approved": "no"},
        {"approved": 0},
        {"approved": None},
        {"approved": True, "by": "ann"},
        {"approved": True, "comment": 7},
    ],
)
def test_an_answer_that_is_not_an_explicit_decision_is_refused(
    rt: Runtime, calls: Calls, payload: Any
) -> None:
    """Only `{"approved": true|false}` (with an optional text comment) decides an approval:
    an empty signal, a bare value or any other field is refused, nothing is written, and the
    approval stays open for a real answer."""
    job_id = waiting_job(rt)
    before = rt.get_job(job_id)
    with pytest.raises(SignalPayloadError, match="approv") as refused:
        rt.signal(job_id, f"{job_id}:ok", payload, approver="ann")
    assert '{"approved": true}' in refused.value.hint
    after = rt.get_job(job_id)
    assert (after.version, after.status) == (before.version, "waiting")
    rt.signal(job_id, f"{job_id}:ok", {"approved": False}, approver="ann")
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "failed"
    assert calls.count(name="pay") == 0


def test_wrong_key_is_rejected_and_writes_nothing(rt: Runtime) -> None:
    job_id = waiting_job(rt)
    before = rt.get_job(job_id)
    for key in ("nope", f"{job_id}:quote", f"{job_id}:pay", f"other:{job_id}:ok"):
        with pytest.raises(SignalRejected) as caught:
            rt.signal(job_id, key, {"approved": True})
        assert f"{job_id}:ok" in caught.value.hint  # it tells which keys are open
    after = rt.get_job(job_id)
    assert (after.version, after.status) == (before.version, "waiting")


def test_unknown_job_and_bad_payload_write_nothing(rt: Runtime) -> None:
    with pytest.raises(JobNotFound):
        rt.signal("no-such-job", "k")
    job_id = waiting_job(rt)
    version = rt.get_job(job_id).version
    with pytest.raises(CanonicalizationError):
        rt.signal(job_id, f"{job_id}:ok", {"when": float("nan")})
    # a payload is the wait node's output, written again inside the job's: one that fits alone
    # but not there is refused here, not when the job completes
    too_deep: Any = 1
    for _ in range(252):
        too_deep = [too_deep]
    with pytest.raises(CanonicalizationError, match="nested too deeply"):
        rt.signal(job_id, f"{job_id}:ok", {"approved": True, "comment": too_deep})
    assert rt.get_job(job_id).version == version


def test_duplicate_signal_is_idempotent(rt: Runtime) -> None:
    job_id = waiting_job(rt)
    key = f"{job_id}:ok"
    _, first = signal_job(rt.store, job_id, key, {"approved": True}, principal=operator("ann"))
    version = rt.get_job(job_id).version
    # again, even with another payload: nothing is appended, the first payload stands
    job, again = signal_job(rt.store, job_id, key, {"approved": False}, principal=operator("bo"))
    assert (first, again) == (True, False)
    assert job.version == version
    assert len(of_type(rt.store.list_events(job_id), "wait_completed")) == 1
    assert rt.run_until_idle() == 1
    assert rt.get_job(job_id).status == "completed"
    # and after the job finished, the same key still changes nothing
    job, again = signal_job(rt.store, job_id, key, {"approved": True}, principal=operator("bo"))
    assert not again and job.status == "completed"
    assert len(of_type(rt.store.list_events(job_id), "wait_completed")) == 1


def test_signal_to_a_finished_job_is_rejected(rt: Runtime) -> None:
    job_id = waiting_job(rt)
    rt.cancel(job_id, reason="not needed")
    version = rt.get_job(job_id).version
    with pytest.raises(SignalRejected, match="cancelled"):
        rt.signal(job_id, f"{job_id}:ok", {"approved": True})
    assert rt.get_job(job_id).version == version
    # a completed job without waits has no key to signal
    done = rt.submit(plan(node("q", "quote", "pure", args={"amount": 1})), {}).job_id
    rt.run_until_idle()
    assert rt.get_job(done).status == "completed"
    with pytest.raises(SignalRejected):
        rt.signal(done, f"{done}:q", {})


def test_a_key_is_only_open_once_its_wait_is_reached(rt: Runtime, calls: Calls) -> None:
    job_id = waiting_job(rt, TWO_WAITS)
    with pytest.raises(SignalRejected):  # "second" is not waited for yet
        rt.signal(job_id, f"{job_id}:second", "early")
    rt.signal(job_id, f"{job_id}:first", "one")
    assert rt.run_until_idle() == 1
    assert rt.get_job(job_id).status == "waiting"
    rt.signal(job_id, f"{job_id}:second", ["two"])
    assert rt.run_until_idle() == 1
    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert job.output == {"echo": {"a": "one", "b": ["two"]}}
    assert calls.count(name="echo") == 1
    assert_log_sound(rt.store, job_id)


def test_concurrent_signals_append_exactly_one_event(rt: Runtime) -> None:
    job_id = waiting_job(rt)
    key = f"{job_id}:ok"
    start = threading.Barrier(8)
    results: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        start.wait()
        try:
            _, appended = signal_job(
                rt.store, job_id, key, {"approved": True}, principal=operator(f"ann{i}")
            )
        except BaseException as exc:  # pragma: no cover - reported below
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(appended)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results) == [False] * 7 + [True]
    [done] = of_type(rt.store.list_events(job_id), "wait_completed")
    assert rt.run_until_idle() == 1
    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert job.output["pay"]["approval"] == done["payload"]
    assert_log_sound(rt.store, job_id)


def test_waiting_job_resumes_from_its_log_in_a_fresh_runtime(
    store_url: str, rt: Runtime, calls: Calls
) -> None:
    """A signal and the pickup after it may come from other processes: the state is the log."""
    job_id = waiting_job(rt)
    with Runtime(store_url, tools=rt.tools) as other:
        other.signal(job_id, f"{job_id}:ok", {"approved": True}, approver="ann")
        assert other.run_until_idle() == 1
    assert rt.get_job(job_id).status == "completed"
    assert calls.count(name="quote") == 1  # the recorded quote was injected, not recomputed


def test_concurrent_decisions_on_many_jobs_do_not_starve_the_store(rt: Runtime) -> None:
    """More signals at once than the PostgreSQL pool has connections (10), each to its own
    job: a decision reads the log inside its own transaction, so none of them waits for a
    second connection while holding the first (which would stall them all until the pool's
    timeout and then fail them)."""
    jobs = [waiting_job(rt) for _ in range(12)]
    start = threading.Barrier(len(jobs))
    errors: list[BaseException] = []
    lock = threading.Lock()

    def send(job_id: str) -> None:
        start.wait()
        try:
            signal_job(
                rt.store, job_id, f"{job_id}:ok", {"approved": True}, principal=operator("a")
            )
        except BaseException as exc:  # pragma: no cover - reported below
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=send, args=(job_id,), daemon=True) for job_id in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "the signals are still waiting"
    assert not errors, errors
    assert {rt.get_job(job_id).status for job_id in jobs} == {"pending"}
