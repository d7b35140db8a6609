"""Crash matrix: a real worker process SIGKILLs itself at each crash point, then the job is
recovered in the test process after the dead worker's lease expires.

Job: charge1 (tool) → compute (pure) → charge2 (tool). The tool either has a ``reconcile`` hook
(it looks the effect up by the dead attempt's external key) or has none. Every real execution
leaves a line in a side-channel file, so the counts below are what happened in the world.

Guarantees checked: a committed effect happens exactly once and its recorded result is the one
that really happened (G1); an invocation caught in flight is reconciled, or parks the job
(plan ``in_flight: park``) without being re-run blindly, or fails it (``in_flight: fail``) (G2);
a finished step — tool or pure — is not run again (G3); the log's closing rule holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.record._replay import build_from_events
from tests.runtime.crash_tools import REGISTRY, charge_plan, counts, read_side
from tests.runtime.helpers import (
    assert_log_sound,
    ledger_rows,
    of_type,
    run_driver,
    wait_lease_expired,
)

CRASH_LEASE = "0.5"  # the crashing worker's lease: short, so recovery can reclaim quickly
NODES = ("charge1", "compute", "charge2")
CHARGES = ("charge1", "charge2")

# point → (node it kills in flight or None, side-channel counts at the moment of the crash)
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
    ("tool.after_acquire", False, "fail"),
    ("tool.after_execute", False, "fail"),
    ("tool.after_execute:2", False, "fail"),
    ("tool.after_execute", True, "fail"),  # reconcile comes first: the policy is not needed
]


def case_id(case: tuple[str, bool, str]) -> str:
    point, reconcile, in_flight = case
    return f"{point}-{'reconcile' if reconcile else 'no_reconcile'}-{in_flight}"


def side_counts(side: Path, job_id: str) -> dict[str, int]:
    charged = counts(side, "charge")
    computed = counts(side, "compute")
    return {node: (computed if node == "compute" else charged)[(job_id, node)] for node in NODES}


def the_charge(side: Path, job_id: str, node: str) -> dict[str, Any]:
    [line] = [
        x
        for x in read_side(side)
        if x["kind"] == "charge" and (x["job"], x["node"]) == (job_id, node)
    ]
    return line


def assert_effects_match_records(rt: Runtime, side: Path, job_id: str) -> None:
    """Each committed charge happened exactly once, and the recorded result is that charge."""
    rows = {r.node_id: r for r in ledger_rows(rt.store, job_id)}
    assert set(rows) == set(CHARGES)
    for node in CHARGES:
        assert rows[node].status == "committed"
        line = the_charge(side, job_id, node)  # exactly one real execution
        assert rows[node].result["charge_id"] == line["key"]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_crash_and_recover(store_url: str, tmp_path: Path, case: tuple[str, bool, str]) -> None:
    point, reconcile, in_flight = case
    in_flight_node, at_crash = POINTS[point]
    side = tmp_path / "side.jsonl"
    tool_name = "crash_charge" if reconcile else "crash_charge_nr"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(
            charge_plan(tool_name, None if in_flight == "park" else in_flight),
            {"side": str(side), "amount": 10},
        ).job_id

        # --- the crash, in a real process ---------------------------------------------------
        proc = run_driver(store_url, "--job", job_id, "--lease", CRASH_LEASE, crash=point)
        assert proc.returncode == -9, f"driver did not die by SIGKILL: {proc}"
        assert side_counts(side, job_id) == at_crash
        after_crash = build_from_events(rt.store.list_events(job_id))
        pending = list(after_crash.pending_tool_invocations.values())
        assert [p["node_id"] for p in pending] == ([in_flight_node] if in_flight_node else [])
        assert rt.get_job(job_id).status == "running"  # its dead worker still holds the lease
        assert_log_sound(rt.store, job_id)

        # --- recovery, after the dead worker's lease ran out ---------------------------------
        wait_lease_expired(rt.store, job_id)
        assert rt.run_until_idle() == 1
        job = rt.get_job(job_id)
        events = assert_log_sound(rt.store, job_id)

        if in_flight_node is not None and not reconcile:
            # Nobody can tell whether the effect happened: never re-run it blindly.
            assert side_counts(side, job_id) == at_crash
            if in_flight == "fail":
                assert job.status == "failed"
                assert job.error["message"] == "invocation in flight or lost"
                [failed] = of_type(events, "job_failed")
                assert failed["node_id"] == in_flight_node
                [closed] = [f for f in of_type(events, "tool_invocation_finished") if f["catch_up"]]
                # whether it acted is unknown, and the record says so (lost: did not act)
                assert closed["outcome"] == "unknown" and closed["node_id"] == in_flight_node
                assert rt.run_until_idle() == 0  # failed for good: nothing runs again
                assert side_counts(side, job_id) == at_crash
                return
            assert job.status == "parked"
            [parked] = of_type(events, "job_parked")
            assert parked["reason"] == "in_flight"
            assert parked["node_id"] == in_flight_node
            assert parked["idempotency_key"] == pending[0]["idempotency_key"]
            assert rt.run_until_idle() == 0  # parked: no worker touches it
            # A person resolves it: the effect did not happen (crash before execute) → retry;
            # it did (crash after execute) → accept the result the payment API reports.
            if "after_acquire" in point:
                rt.resume(job_id, "retry", by="tester")
            else:
                line = the_charge(side, job_id, in_flight_node)
                accepted = {
                    "charge_id": line["key"],
                    "amount": 10 if in_flight_node == "charge1" else 11,
                }
                rt.resume(job_id, "accept_result", result=accepted, by="tester")
            assert rt.get_job(job_id).status == "pending"
            assert_log_sound(rt.store, job_id)
            assert rt.run_until_idle() == 1
            job = rt.get_job(job_id)
            events = assert_log_sound(rt.store, job_id)

        assert job.status == "completed", job.error
        expected = {"charge1": 1, "compute": 1, "charge2": 1}
        if point == "pure.after_execute":
            expected["compute"] = 2  # it never finished, so it ran again: allowed for pure
        assert side_counts(side, job_id) == expected
        assert_effects_match_records(rt, side, job_id)
        # the job's output is the chain of what really happened
        charge1 = the_charge(side, job_id, "charge1")["key"]
        assert job.output == {
            "charge2": {"charge_id": the_charge(side, job_id, "charge2")["key"], "amount": 11}
        }
        compute_out = build_from_events(events).node_output("compute")
        assert compute_out == {"amount": 11, "from": charge1}

        finished = of_type(events, "tool_invocation_finished")
        catch_ups = [f for f in finished if f["catch_up"]]
        if in_flight_node is None:
            assert not catch_ups
        elif reconcile:
            [caught] = catch_ups
            assert caught["node_id"] == in_flight_node
            assert caught["outcome"] == ("lost" if "after_acquire" in point else "success")
        # a completed job never runs again
        assert rt.run_until_idle() == 0
        assert side_counts(side, job_id) == expected
