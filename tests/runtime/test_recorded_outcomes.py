"""Recovery after a crash that came between a recorded outcome and what it decides.

A real worker process runs the job and dies (SIGKILL, at a crash point or inside user code);
the job is recovered in the test process. Each case checks what really happened in the world
(the side channel) and that the log and ledger agree (``assert_log_sound``, ``verify_job``):

- a step whose failure was final (permanent, out of attempts, compensated, or compensatable
  with its compensation cut short) is not run again after the crash, and no step starts that
  the run which recorded the failure would not have started: the job fails;
- a job that fails, by any path, closes every invocation still open (docs/formats.md §3);
- ``resume`` decides only the invocation the job parked on: another open invocation is
  resolved by its own tool's reconcile hook when the job runs again;
- a step's args come from its upstream steps' recorded outputs in the run that records them as
  in the run that recovers it, so both derive the same idempotency key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.record._replay import build_from_events
from affidavit.verify import verify_job
from tests.runtime.crash_tools import REGISTRY, counts, read_side
from tests.runtime.helpers import (
    assert_log_sound,
    ledger_rows,
    of_type,
    run_driver,
    wait_lease_expired,
)

LEASE = "0.5"


def tool_node(node_id: str, tool: str, deps: list[str] | None = None, **args: Any) -> Any:
    node: dict[str, Any] = {
        "id": node_id,
        "type": "tool",
        "tool": tool,
        "args": {"side": "${input.side}", **args},
    }
    if deps:
        node["depends_on"] = deps
    return node


def graph(
    *nodes: Any, max_attempts: int = 1, in_flight: str = "park", backoff: float = 0
) -> dict[str, Any]:
    return {
        "name": "recorded-outcomes",
        "retry": {"max_attempts": max_attempts, "backoff_seconds": backoff},
        "in_flight": in_flight,
        "nodes": list(nodes),
    }


def crash_then_recover(
    rt: Runtime, url: str, job_id: str, crash: str | None, step_concurrency: int
) -> None:
    """Run the job in a worker process that dies, then recover it here."""
    args = ["--job", job_id, "--lease", LEASE, "--step-concurrency", str(step_concurrency)]
    proc = run_driver(url, *args, crash=crash)
    assert proc.returncode == -9, proc.stderr  # the worker died (SIGKILL) mid-run
    wait_lease_expired(rt.store, job_id)
    rt.run_until_idle()


def side_count(side: Path, job_id: str, kind: str, node_id: str) -> int:
    return counts(side, kind)[(job_id, node_id)]


def assert_closed_and_verified(rt: Runtime, job_id: str) -> None:
    assert_log_sound(rt.store, job_id)
    replay = build_from_events(rt.store.list_events(job_id))
    assert replay.pending_tool_invocations == {}
    assert all(row.status != "started" for row in ledger_rows(rt.store, job_id))
    result = verify_job(rt.store, job_id)
    assert result.ok, result.to_dict()


@pytest.mark.parametrize(
    ("failure", "y_tool"),
    [
        ("permanent", "crash_slow_charge"),
        ("out_of_attempts", "crash_slow_charge"),
        ("permanent", "crash_slow_charge_nr"),
    ],
)
def test_a_final_failure_is_not_run_again_after_a_crash(
    store_url: str, tmp_path: Path, failure: str, y_tool: str
) -> None:
    """x fails for good while y is still running; the worker dies at y's after_execute, before
    job_failed. Recovery fails the job: x is not called again (max_attempts 1), `later` (after
    y) never starts, and no tool is called. y's charge happened: with a reconcile hook it is
    found and recorded as committed (a catch-up) before the job fails; without one y's
    invocation is closed as lost."""
    side = tmp_path / "side.jsonl"
    failing = "crash_decline" if failure == "permanent" else "crash_busy"
    plan = graph(
        tool_node("x", failing),
        tool_node("y", y_tool, amount=2, delay=1.0),
        tool_node("later", "crash_charge", ["y"], amount=3),
    )
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(plan, {"side": str(side)}).job_id
        crash_then_recover(rt, store_url, job_id, "tool.after_execute", step_concurrency=2)
        job = rt.get_job(job_id)
        assert job.status == "failed"
        kind = "decline" if failure == "permanent" else "busy"
        assert side_count(side, job_id, kind, "x") == 1
        assert side_count(side, job_id, "charge", "y") == 1
        assert side_count(side, job_id, "charge", "later") == 0
        events = rt.store.list_events(job_id)
        assert [p["attempt"] for p in of_type(events, "node_started") if p["node_id"] == "x"] == [1]
        assert of_type(events, "job_failed")[0]["node_id"] == "x"
        assert job.error is not None and job.error["message"] in (
            "card declined",
            "try again later",
        )
        closing = [p for p in of_type(events, "tool_invocation_finished") if p["node_id"] == "y"]
        y_finished = [p for p in of_type(events, "node_finished") if p["node_id"] == "y"]
        y_rows = [r for r in ledger_rows(rt.store, job_id) if r.node_id == "y"]
        if y_tool == "crash_slow_charge":
            assert [(p["outcome"], p["catch_up"]) for p in closing] == [("success", True)]
            assert [p["result_type"] for p in y_finished] == ["side_effect_committed"]
            assert [r.status for r in y_rows] == ["committed"]
        else:
            # it may have acted (it did): unknown, never lost
            assert [(p["outcome"], p["catch_up"]) for p in closing] == [("unknown", True)]
            assert y_finished == []
            assert [r.status for r in y_rows] == ["failed"]
        assert_closed_and_verified(rt, job_id)


def test_a_retryable_failure_with_attempts_left_is_retried_after_a_crash(
    store_url: str, tmp_path: Path
) -> None:
    """x fails as retryable and waits out its backoff; the worker dies then (y's after_execute).
    With an attempt left, recovery runs x's next attempt, as the run would have."""
    side = tmp_path / "side.jsonl"
    plan = graph(
        tool_node("x", "crash_busy"),
        tool_node("y", "crash_slow_charge", amount=2, delay=1.0),
        max_attempts=2,
        backoff=5,  # long enough for y to crash inside it; recovery waits out the rest
    )
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(plan, {"side": str(side)}).job_id
        args = ["--job", job_id, "--lease", LEASE, "--step-concurrency", "2"]
        proc = run_driver(store_url, *args, crash="tool.after_execute")
        assert proc.returncode == -9, proc.stderr
        assert side_count(side, job_id, "busy", "x") == 1  # the crash came during the backoff
        wait_lease_expired(rt.store, job_id)
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "failed"  # crash_busy never succeeds
        assert side_count(side, job_id, "busy", "x") == 2
        events = rt.store.list_events(job_id)
        x_attempts = [p["attempt"] for p in of_type(events, "node_started") if p["node_id"] == "x"]
        assert x_attempts == [1, 2]
        # y did charge before the crash: its reconcile hook finds it (catch-up), no second charge
        assert side_count(side, job_id, "charge", "y") == 1
        assert_closed_and_verified(rt, job_id)


def test_a_compensated_step_still_fails_the_job_after_a_crash(
    store_url: str, tmp_path: Path
) -> None:
    """x fails as compensatable and is compensated; the worker dies (y's after_execute) before
    job_failed. Without the crash the job fails; after it, too — `ship` (after x) never runs."""
    side = tmp_path / "side.jsonl"
    plan = graph(
        tool_node("x", "crash_book"),
        tool_node("ship", "crash_charge", ["x"], amount=9),
        tool_node("y", "crash_slow_charge", amount=2, delay=1.0),
    )
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(plan, {"side": str(side)}).job_id
        crash_then_recover(rt, store_url, job_id, "tool.after_execute", step_concurrency=2)
        job = rt.get_job(job_id)
        assert job.status == "failed"
        assert job.error == {"type": "CompensatableError", "message": "half booked"}
        assert side_count(side, job_id, "book", "x") == 1
        assert side_count(side, job_id, "release", "x") == 1
        assert side_count(side, job_id, "charge", "ship") == 0
        assert_closed_and_verified(rt, job_id)


def test_a_compensation_cut_by_a_crash_is_not_run_again(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies inside the compensation. Recovery neither books again nor compensates
    again (the release may have happened): the job fails, saying the compensation was cut."""
    side = tmp_path / "side.jsonl"
    plan = graph(tool_node("x", "crash_book"), tool_node("ship", "crash_charge", ["x"], amount=9))
    monkeypatch.setenv("AFFIDAVIT_TEST_KILL_IN_COMPENSATION", "1")
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(plan, {"side": str(side)}).job_id
        crash_then_recover(rt, store_url, job_id, None, step_concurrency=1)
        job = rt.get_job(job_id)
        assert job.status == "failed"
        assert job.error is not None and job.error["type"] == "compensation_interrupted"
        assert job.error["error"] == {"type": "CompensatableError", "message": "half booked"}
        assert side_count(side, job_id, "book", "x") == 1
        assert side_count(side, job_id, "release", "x") == 1
        assert side_count(side, job_id, "charge", "ship") == 0
        assert_closed_and_verified(rt, job_id)


def two_in_flight(
    rt: Runtime, url: str, side: Path, in_flight: str, b_tool: str = "crash_slow_charge"
) -> str:
    """a (no reconcile) and b (by default with reconcile) both charged and in flight when the
    worker dies at a's after_execute; recovered here once."""
    plan = graph(
        tool_node("a", "crash_slow_charge_nr", amount=1, delay=0.2),
        tool_node("b", b_tool, amount=2, delay=1.5),
        max_attempts=3,
        in_flight=in_flight,
    )
    job_id = rt.submit(plan, {"side": str(side)}).job_id
    crash_then_recover(rt, url, job_id, "tool.after_execute", step_concurrency=2)
    assert side_count(side, job_id, "charge", "a") == 1
    assert side_count(side, job_id, "charge", "b") == 1
    return job_id


@pytest.mark.parametrize("decision", ["retry", "accept_result"])
def test_resume_decides_only_the_parked_invocation(
    store_url: str, tmp_path: Path, decision: str
) -> None:
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5, step_concurrency=2) as rt:
        job_id = two_in_flight(rt, store_url, side, "park")
        assert rt.get_job(job_id).status == "parked"
        parked = of_type(rt.store.list_events(job_id), "job_parked")[0]
        assert parked["node_id"] == "a"
        # b's reconcile ran before the park (open invocations that can be resolved without a
        # person go first): only a is left for the person
        open_now = build_from_events(rt.store.list_events(job_id)).pending_tool_invocations
        assert [p["node_id"] for p in open_now.values()] == ["a"]
        checked = {"charge_id": "checked-by-hand", "amount": 1}
        rt.resume(job_id, decision, result=checked if decision == "accept_result" else None)
        rt.run_until_idle()
        job = rt.get_job(job_id)
        assert job.status == "completed"
        # b was resolved by its own reconcile hook: caught up with the charge that happened
        assert side_count(side, job_id, "charge", "b") == 1
        b_charge = next(
            line["key"]
            for line in read_side(side)
            if line["kind"] == "charge" and line["node"] == "b"
        )
        assert job.output is not None and job.output["b"] == {"charge_id": b_charge, "amount": 2}
        closing_b = [
            (p["outcome"], p["catch_up"])
            for p in of_type(rt.store.list_events(job_id), "tool_invocation_finished")
            if p["node_id"] == "b"
        ]
        assert closing_b == [("success", True)]
        # a: as the person decided — accepted as checked, or run again
        if decision == "accept_result":
            assert job.output["a"] == checked
            assert side_count(side, job_id, "charge", "a") == 1
        else:
            assert side_count(side, job_id, "charge", "a") == 2
        assert_closed_and_verified(rt, job_id)


def test_reconcilable_invocations_are_resolved_before_the_job_fails(
    store_url: str, tmp_path: Path
) -> None:
    """a (no reconcile, policy fail) and b (reconcile) open: b is caught up first — its charge
    recorded as what happened — and only then does a fail the job."""
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5, step_concurrency=2) as rt:
        job_id = two_in_flight(rt, store_url, side, "fail")
        assert rt.get_job(job_id).status == "failed"
        closing = {
            p["node_id"]: (p["outcome"], p["catch_up"])
            for p in of_type(rt.store.list_events(job_id), "tool_invocation_finished")
        }
        assert closing == {"a": ("unknown", True), "b": ("success", True)}
        assert side_count(side, job_id, "charge", "b") == 1
        assert_closed_and_verified(rt, job_id)


@pytest.mark.parametrize("how", ["policy_fail", "resume_fail"])
def test_a_failed_job_leaves_no_invocation_open(store_url: str, tmp_path: Path, how: str) -> None:
    """Neither open invocation can be reconciled: the one the job fails on is closed by that
    decision, the other by the failure itself."""
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5, step_concurrency=2) as rt:
        policy = "fail" if how == "policy_fail" else "park"
        job_id = two_in_flight(rt, store_url, side, policy, b_tool="crash_slow_charge_nr")
        if how == "resume_fail":
            assert rt.get_job(job_id).status == "parked"
            rt.resume(job_id, "fail")
        job = rt.get_job(job_id)
        assert job.status == "failed"
        assert side_count(side, job_id, "charge", "a") == 1
        assert side_count(side, job_id, "charge", "b") == 1
        closing = {
            p["node_id"]: p["outcome"]
            for p in of_type(rt.store.list_events(job_id), "tool_invocation_finished")
        }
        assert closing == {"a": "unknown", "b": "unknown"}  # both acted: never lost
        assert_closed_and_verified(rt, job_id)


def test_args_come_from_recorded_outputs_so_a_recovery_finds_the_invocation(
    store_url: str, tmp_path: Path
) -> None:
    """``first`` returns an object that ``second`` (the same pure function) changes after
    ``first``'s output was recorded. ``charge`` takes ``first``'s output: the run that dies at
    its after_execute must derive its args (and so its idempotency key) from the recorded
    output, as the recovery does — else the recovery finds no invocation in flight and
    charges again."""
    side = tmp_path / "side.jsonl"
    tally = {"side": "${input.side}"}
    plan = graph(
        {"id": "first", "type": "pure", "tool": "crash_tally", "args": tally},
        {"id": "second", "type": "pure", "tool": "crash_tally", "args": tally,
         "depends_on": ["first"]},
        tool_node("charge", "crash_charge", ["second"], amount="${first.calls}"),
    )  # fmt: skip
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(plan, {"side": str(side)}).job_id
        crash_then_recover(rt, store_url, job_id, "tool.after_execute", step_concurrency=1)
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        assert side_count(side, job_id, "charge", "charge") == 1
        events = rt.store.list_events(job_id)
        [finished] = of_type(events, "tool_invocation_finished")
        assert finished["catch_up"] is True  # found by reconcile, not charged again
        assert finished["result"]["amount"] == 1  # first's recorded output
        assert [r.status for r in ledger_rows(rt.store, job_id)] == ["committed"]
        assert_closed_and_verified(rt, job_id)
