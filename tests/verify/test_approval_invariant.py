"""The approval invariant, offline: a log in which a tool that requires approval acted without
a granted approval of that call, or an approval decided by a principal it does not allow, fails
verification — even with its chain recomputed (what anyone holding the database can do)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.approvals import Principal
from affidavit.runtime._decisions import signal_job
from affidavit.verify import verify_job
from affidavit.verify.verification import verify_event_rows
from tests.runtime.helpers import node, plan
from tests.verify.helpers import rows

ALICE = Principal("alice", "approver", "k-alice")


def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
    return {"paid": amount}


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    t = Tool("pay", pay, "tool")
    t.requires_approval = True
    echo = Tool("echo", lambda ctx, ok: {"ok": ok}, "pure")
    with Runtime(store_url, tools=ToolRegistry([t, echo]), lease_seconds=5) as runtime:
        yield runtime


def approved_job(rt: Runtime) -> str:
    job_id = rt.submit(
        plan(node("charge", "pay", args={"amount": 99_999_999})), {}, submitted_by="mallory"
    ).job_id
    assert rt.run_job(job_id).status == "waiting"
    [asked] = [e.payload for e in rt.store.list_events(job_id) if e.type == "job_waiting"]
    signal_job(rt.store, job_id, asked["correlation_key"], {"approved": True}, principal=ALICE)
    assert rt.run_job(job_id).status == "completed"
    assert verify_job(rt.store, job_id).ok
    return job_id


def events(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    return [{"type": e.type, "payload": e.payload} for e in rt.store.list_events(job_id)]


def replay_of(job_id: str, log: list[dict[str, Any]]) -> Any:
    result = verify_event_rows(job_id, rows(log), status="completed")
    return result.replay_proof_result


def test_the_unforged_log_passes_the_invariant(rt: Runtime) -> None:
    job_id = approved_job(rt)
    assert replay_of(job_id, events(rt, job_id)).ok


def test_an_approval_requiring_call_without_its_approval_fails(rt: Runtime) -> None:
    job_id = approved_job(rt)
    forged = [e for e in events(rt, job_id) if e["type"] not in ("job_waiting", "wait_completed")]
    replay = replay_of(job_id, forged)
    assert not replay.ok and replay.invariant == "approval", replay.error
    assert "requires approval" in replay.error


def test_an_approval_decided_by_the_submitter_fails(rt: Runtime) -> None:
    job_id = approved_job(rt)
    forged = events(rt, job_id)
    for e in forged:
        if e["type"] == "wait_completed":
            e["payload"]["signalled_by"] = "mallory"
            e["payload"]["decided_by"][0]["principal"] = "mallory"
    replay = replay_of(job_id, forged)
    assert not replay.ok and replay.invariant == "approval", replay.error
    assert "submitted the job" in replay.error


def test_an_approval_without_its_decisions_fails(rt: Runtime) -> None:
    job_id = approved_job(rt)
    forged = events(rt, job_id)
    for e in forged:
        if e["type"] == "wait_completed":
            del e["payload"]["decided_by"]
    replay = replay_of(job_id, forged)
    assert not replay.ok and replay.invariant == "approval", replay.error


def test_a_call_invoked_without_its_mark_after_a_request_fails(rt: Runtime) -> None:
    """Hiding the requirement at the call is caught while the request for it is in the log."""
    job_id = approved_job(rt)
    forged = events(rt, job_id)
    for e in forged:
        if e["type"] == "tool_invocation_started":
            del e["payload"]["requires_approval"], e["payload"]["approval_key"]
    replay = replay_of(job_id, forged)
    assert not replay.ok and replay.invariant == "approval", replay.error


def test_a_two_person_approval_answered_after_one_fails(rt: Runtime) -> None:
    job_id = rt.submit(
        plan(
            {"id": "ok", "type": "approval", "min_approvals": 2},
            node("log", "echo", "pure", args={"ok": "${ok}"}, deps=["ok"]),
        ),
        {},
    ).job_id
    assert rt.run_job(job_id).status == "waiting"
    signal_job(rt.store, job_id, f"{job_id}:ok", {"approved": True}, principal=ALICE)
    bob = Principal("bob", "approver", "k-bob")
    signal_job(rt.store, job_id, f"{job_id}:ok", {"approved": True}, principal=bob)
    assert rt.run_job(job_id).status == "completed"
    log = events(rt, job_id)
    assert replay_of(job_id, log).ok
    forged = [e for e in log if e["type"] != "approval_recorded"]
    for e in forged:
        if e["type"] == "wait_completed":
            e["payload"]["decided_by"] = e["payload"]["decided_by"][-1:]
    replay = replay_of(job_id, forged)
    assert not replay.ok and replay.invariant == "approval", replay.error
    assert "undecided" in replay.error
