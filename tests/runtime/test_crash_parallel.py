"""A worker running two independent tool steps of one job at once (``--step-concurrency 2``)
is SIGKILLed while both are in flight, on SQLite and PostgreSQL; the job is recovered after the
dead worker's lease expires.

Job: ``quick`` and ``slow`` (independent charges that both act at once and return 1 s and
3 s later) → ``join`` (a charge after both). The process dies at the first
``tool.after_execute``: ``quick`` has acted and returned, ``slow`` has acted and is still
inside its call, neither is recorded as finished — two invocations in flight in one log.

Checked: with a reconcile hook both are caught up and nothing runs twice; without one the job
parks on one in-flight invocation at a time, nothing is re-run, and once a person accepted what
the payment API reports for each, the job completes with every charge made exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.record._replay import build_from_events
from tests.runtime.crash_tools import REGISTRY, counts, read_side
from tests.runtime.helpers import (
    assert_log_sound,
    ledger_rows,
    of_type,
    run_driver,
    wait_lease_expired,
)

NODES = ("quick", "slow", "join")
AMOUNTS = {"quick": 1, "slow": 2, "join": 3}


def parallel_plan(reconcile: bool) -> dict[str, Any]:
    slow_tool = "crash_slow_charge" if reconcile else "crash_slow_charge_nr"
    charge_tool = "crash_charge" if reconcile else "crash_charge_nr"

    def args(node: str, delay: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"side": "${input.side}", "amount": AMOUNTS[node]}
        return out if delay is None else {**out, "delay": delay}

    return {
        "name": "crash-parallel",
        "nodes": [
            {"id": "quick", "type": "tool", "tool": slow_tool, "args": args("quick", 1.0)},
            {"id": "slow", "type": "tool", "tool": slow_tool, "args": args("slow", 3.0)},
            {
                "id": "join",
                "type": "tool",
                "tool": charge_tool,
                "args": args("join"),
                "depends_on": ["quick", "slow"],
            },
        ],
    }


def charged(side: Path, job_id: str) -> dict[str, int]:
    made = counts(side, "charge")
    return {node: made[(job_id, node)] for node in NODES}


def the_charge(side: Path, job_id: str, node: str) -> dict[str, Any]:
    [line] = [
        x
        for x in read_side(side)
        if x["kind"] == "charge" and (x["job"], x["node"]) == (job_id, node)
    ]
    return line


@pytest.mark.parametrize("reconcile", [True, False], ids=["reconcile", "no_reconcile"])
def test_two_steps_in_flight_at_a_crash(store_url: str, tmp_path: Path, reconcile: bool) -> None:
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        job_id = rt.submit(parallel_plan(reconcile), {"side": str(side)}).job_id

        proc = run_driver(
            store_url,
            "--job",
            job_id,
            "--lease",
            "0.5",
            "--step-concurrency",
            "2",
            crash="tool.after_execute",
        )
        assert proc.returncode == -9, f"driver did not die by SIGKILL: {proc}"
        assert charged(side, job_id) == {"quick": 1, "slow": 1, "join": 0}
        pending = build_from_events(rt.store.list_events(job_id)).pending_tool_invocations
        assert sorted(p["node_id"] for p in pending.values()) == ["quick", "slow"]
        assert_log_sound(rt.store, job_id)

        wait_lease_expired(rt.store, job_id)
        if reconcile:
            assert rt.run_until_idle() == 1
        else:
            resolved: list[str] = []
            for _ in range(2):  # one park per invocation in flight
                assert rt.run_until_idle() == 1
                job = rt.get_job(job_id)
                assert job.status == "parked"
                parked = of_type(assert_log_sound(rt.store, job_id), "job_parked")[-1]
                assert parked["reason"] == "in_flight" and parked["node_id"] not in resolved
                # nobody can tell whether it acted: nothing is re-run while it is parked
                assert charged(side, job_id) == {"quick": 1, "slow": 1, "join": 0}
                node = parked["node_id"]
                line = the_charge(side, job_id, node)
                accepted = {"charge_id": line["key"], "amount": AMOUNTS[node]}
                rt.resume(job_id, "accept_result", result=accepted, by="tester")
                resolved.append(node)
            assert sorted(resolved) == ["quick", "slow"]
            assert rt.run_until_idle() == 1

        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        assert charged(side, job_id) == {"quick": 1, "slow": 1, "join": 1}
        events = assert_log_sound(rt.store, job_id)
        rows = {r.node_id: r for r in ledger_rows(rt.store, job_id)}
        for node in NODES:  # the recorded result is the charge that really happened
            assert rows[node].status == "committed"
            assert rows[node].result["charge_id"] == the_charge(side, job_id, node)["key"]
        catch_ups = [f for f in of_type(events, "tool_invocation_finished") if f["catch_up"]]
        if reconcile:
            assert sorted((c["node_id"], c["outcome"]) for c in catch_ups) == [
                ("quick", "success"),
                ("slow", "success"),
            ]
        assert rt.run_until_idle() == 0
        assert charged(side, job_id) == {"quick": 1, "slow": 1, "join": 1}
