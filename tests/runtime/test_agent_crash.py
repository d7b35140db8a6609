"""Crash windows inside agent jobs, on both backends: a real worker process SIGKILLs itself at
each crash point while running the charge agent (charge → compute → charge, see
crash_tools.crash_agent), then the job is recovered after the dead worker's lease expired — the
function runs again from the top, recorded calls return without executing.

Checked as for plans (test_crash_matrix): a committed charge happened exactly once and its
recorded result is that charge (G1); a call caught in flight is reconciled, parks the job or
fails it, never re-run blindly (G2); a finished call — tool or pure — is not run again (G3).
Also: killed inside a tool, during replay, while waiting, while sleeping.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.record._replay import build_from_events
from tests.runtime.crash_tools import REGISTRY, counts, read_side
from tests.runtime.helpers import assert_log_sound, of_type, run_driver, wait_lease_expired

CRASH_LEASE = "0.5"
KINDS = ("charge1", "compute", "charge2")

# point → (call it kills in flight or None, real executions at the moment of the crash)
POINTS: dict[str, tuple[str | None, dict[str, int]]] = {
    "tool.after_acquire": ("charge1", {"charge1": 0, "compute": 0, "charge2": 0}),
    "tool.after_execute": ("charge1", {"charge1": 1, "compute": 0, "charge2": 0}),
    "tool.after_commit": (None, {"charge1": 1, "compute": 0, "charge2": 0}),
    "pure.after_execute": (None, {"charge1": 1, "compute": 1, "charge2": 0}),
    "job.before_complete": (None, {"charge1": 1, "compute": 1, "charge2": 1}),
    "tool.after_acquire:2": ("charge2", {"charge1": 1, "compute": 1, "charge2": 0}),
    "tool.after_execute:2": ("charge2", {"charge1": 1, "compute": 1, "charge2": 1}),
}
CASES = [(point, reconcile, "park") for point in POINTS for reconcile in (True, False)] + [
    ("tool.after_execute", False, "fail"),
    ("tool.after_acquire:2", False, "fail"),
]
# the calls' node ids: charge1 is call 0, compute 1, charge2 2 (no wait or sleep in between)
NODES = {"charge1": "#0", "compute": "#1", "charge2": "#2"}


def case_id(case: tuple[str, bool, str]) -> str:
    point, reconcile, in_flight = case
    return f"{point}-{'reconcile' if reconcile else 'no_reconcile'}-{in_flight}"


def side_counts(side: Path, job_id: str, nodes: dict[str, str]) -> dict[str, int]:
    charged, computed = counts(side, "charge"), counts(side, "compute")
    return {
        name: (computed if name == "compute" else charged)[(job_id, node)]
        for name, node in nodes.items()
    }


def the_charge(side: Path, job_id: str, node: str) -> dict[str, Any]:
    [line] = [
        x
        for x in read_side(side)
        if x["kind"] == "charge" and (x["job"], x["node"]) == (job_id, node)
    ]
    return line


def assert_completed_once(rt: Runtime, side: Path, job_id: str, nodes: dict[str, str]) -> None:
    """The job completed; each charge happened once and the output is the real second one."""
    job = rt.get_job(job_id)
    assert job.status == "completed", job.error
    events = assert_log_sound(rt.store, job_id)
    replay = build_from_events(events)
    for name in ("charge1", "charge2"):
        line = the_charge(side, job_id, nodes[name])
        assert replay.node_output(nodes[name])["charge_id"] == line["key"]
    second = the_charge(side, job_id, nodes["charge2"])
    assert job.output == {"charge2": {"charge_id": second["key"], "amount": 11}}
    assert rt.run_until_idle() == 0


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_agent_crash_and_recover(
    store_url: str, tmp_path: Path, case: tuple[str, bool, str]
) -> None:
    point, reconcile, in_flight = case
    in_flight_call, at_crash = POINTS[point]
    side = tmp_path / "side.jsonl"
    tool_name = "crash_charge" if reconcile else "crash_charge_nr"
    agent = "crash_agent" if in_flight == "park" else "crash_agent_fail"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(agent, {"side": str(side), "amount": 10, "tool_name": tool_name}).job_id
        proc = run_driver(store_url, "--job", job_id, "--lease", CRASH_LEASE, crash=point)
        assert proc.returncode == -9, f"driver did not die by SIGKILL: {proc}"
        assert side_counts(side, job_id, NODES) == at_crash
        after = build_from_events(rt.store.list_events(job_id))
        pending = [p["node_id"] for p in after.pending_tool_invocations.values()]
        assert pending == ([NODES[in_flight_call]] if in_flight_call else [])
        assert_log_sound(rt.store, job_id)

        wait_lease_expired(rt.store, job_id)
        assert rt.run_until_idle() == 1
        job = rt.get_job(job_id)
        events = assert_log_sound(rt.store, job_id)
        if in_flight_call is not None and not reconcile:
            assert side_counts(side, job_id, NODES) == at_crash  # never re-run blindly
            if in_flight == "fail":
                assert job.status == "failed"
                assert job.error["message"] == "invocation in flight or lost"
                assert rt.run_until_idle() == 0
                return
            assert job.status == "parked"
            [parked] = of_type(events, "job_parked")
            assert parked["reason"] == "in_flight"
            assert parked["node_id"] == NODES[in_flight_call]
            if "after_acquire" in point:
                rt.resume(job_id, "retry", by="tester")
            else:
                line = the_charge(side, job_id, NODES[in_flight_call])
                amount = 10 if in_flight_call == "charge1" else 11
                rt.resume(
                    job_id,
                    "accept_result",
                    result={"charge_id": line["key"], "amount": amount},
                    by="tester",
                )
            assert rt.run_until_idle() == 1
        expected = {"charge1": 1, "compute": 1, "charge2": 1}
        if point == "pure.after_execute":
            expected["compute"] = 2  # it never finished, so it ran again: allowed for pure
        assert side_counts(side, job_id, NODES) == expected
        assert_completed_once(rt, side, job_id, NODES)


def test_killed_inside_a_tool(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit("crash_agent", {"side": str(side), "amount": 10}).job_id
        monkeypatch.setenv("AFFIDAVIT_TEST_KILL_IN_TOOL", "1")
        proc = run_driver(store_url, "--job", job_id, "--lease", CRASH_LEASE)
        monkeypatch.delenv("AFFIDAVIT_TEST_KILL_IN_TOOL")
        assert proc.returncode == -9, proc
        assert side_counts(side, job_id, NODES) == {"charge1": 1, "compute": 0, "charge2": 0}
        wait_lease_expired(rt.store, job_id)
        assert rt.run_until_idle() == 1  # reconcile finds the charge: caught up, not re-run
        assert side_counts(side, job_id, NODES) == {"charge1": 1, "compute": 1, "charge2": 1}
        assert_completed_once(rt, side, job_id, NODES)
        events = rt.store.list_events(job_id)
        [caught] = [f for f in of_type(events, "tool_invocation_finished") if f["catch_up"]]
        assert caught["node_id"] == "#0" and caught["outcome"] == "success"


def test_killed_during_replay(store_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit("crash_agent", {"side": str(side), "amount": 10}).job_id
        first = run_driver(
            store_url, "--job", job_id, "--lease", CRASH_LEASE, crash="tool.after_execute:2"
        )
        assert first.returncode == -9, first
        wait_lease_expired(rt.store, job_id)
        # the recovery dies while it replays the recorded calls (the second one returned)
        second = run_driver(
            store_url, "--job", job_id, "--lease", CRASH_LEASE, crash="agent.replay_step:2"
        )
        assert second.returncode == -9, second
        assert side_counts(side, job_id, NODES) == {"charge1": 1, "compute": 1, "charge2": 1}
        assert_log_sound(rt.store, job_id)
        wait_lease_expired(rt.store, job_id)
        assert rt.run_until_idle() == 1
        assert side_counts(side, job_id, NODES) == {"charge1": 1, "compute": 1, "charge2": 1}
        assert_completed_once(rt, side, job_id, NODES)


def test_killed_while_waiting(store_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    nodes = {"charge1": "#0", "compute": "#2", "charge2": "#3"}
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit("crash_agent", {"side": str(side), "amount": 10, "wait": True}).job_id
        proc = run_driver(
            store_url, "--job", job_id, "--lease", CRASH_LEASE, crash="wait.after_record"
        )
        assert proc.returncode == -9, proc
        job = rt.get_job(job_id)
        assert job.status == "waiting" and job.lease_owner is None  # nobody holds it
        assert rt.run_until_idle() == 0
        rt.signal(job_id, "go", {"ok": True})
        assert rt.run_until_idle() == 1
        assert side_counts(side, job_id, nodes) == {"charge1": 1, "compute": 1, "charge2": 1}
        assert_completed_once(rt, side, job_id, nodes)


def test_killed_while_sleeping(store_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    nodes = {"charge1": "#0", "compute": "#2", "charge2": "#3"}
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit("crash_agent", {"side": str(side), "amount": 10, "sleep": 0.5}).job_id
        proc = run_driver(
            store_url, "--job", job_id, "--lease", CRASH_LEASE, crash="sleep.after_record"
        )
        assert proc.returncode == -9, proc
        job = rt.get_job(job_id)
        assert job.status == "waiting" and job.lease_owner is None
        # another worker process picks it up once the timer is due
        deadline = time.monotonic() + 30
        while rt.get_job(job_id).status != "completed" and time.monotonic() < deadline:
            run_driver(store_url, "--lease", "5")
            time.sleep(0.1)
        assert side_counts(side, job_id, nodes) == {"charge1": 1, "compute": 1, "charge2": 1}
        assert_completed_once(rt, side, job_id, nodes)
        events = rt.store.list_events(job_id)
        [completed] = of_type(events, "wait_completed")
        assert completed["signalled_by"] == "timer"
