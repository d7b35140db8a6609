"""What the trace says of steps an operator looks at first, on SQLite and PostgreSQL: a tool
call running in a live run is `running` (in flight only when no live run holds it), an answered
approval is `approved` or `denied` (not `pure`), each try names its worker, and a step a later
attempt recovered says how (caught up by reconcile, or re-run after the lost call) — for plan
and agent jobs alike. The job's input is in the trace."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import affidavit.core.crash as crash_module
from affidavit import AgentContext, Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.approvals import Principal
from affidavit.record._trace import job_trace
from affidavit.runtime._agent import Agent
from affidavit.runtime._decisions import signal_job
from affidavit.store import Store
from tests.cli.test_cli import cli
from tests.runtime.helpers import SimulatedCrash, node, plan, wait_lease_expired
from tests.verify.agent_log import AgentLog, store_log

ANN = Principal("ann", "approver", "k-ann")


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``crash_at(point)``: the next run that reaches that point dies there."""

    def arm(point: str) -> None:
        armed = [True]

        def crash_point(name: str) -> None:
            if name == point and armed[0]:
                armed[0] = False
                raise SimulatedCrash(name)

        monkeypatch.setattr(crash_module, "crash_point", crash_point)

    return arm


def _state(store: Store, job_id: str, node_id: str) -> dict[str, Any]:
    [found] = [n for n in job_trace(store, job_id)["nodes"] if n["id"] == node_id]
    return found


def test_a_tool_call_of_a_live_run_is_running_and_one_a_dead_run_left_is_in_flight(
    store_url: str, crash_at: Callable[[str], None]
) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(ctx: ToolContext) -> dict[str, Any]:
        entered.set()
        assert release.wait(30)
        return {"done": True}

    with Runtime(store_url, tools=ToolRegistry([Tool("slow", slow, "tool")])) as rt:
        job_id = rt.submit(plan(node("s", "slow")), {"order": "A-1"}).job_id
        runner = threading.Thread(target=rt.run_until_idle)
        runner.start()
        try:
            assert entered.wait(30)
            step = _state(rt.store, job_id, "s")
            assert step["state"] == "running", step
            assert step["idempotency_key"]  # (its call is open: T1 recorded, T2 not yet)
        finally:
            release.set()
            runner.join(30)
        assert _state(rt.store, job_id, "s")["state"] == "side_effect_committed"
        assert job_trace(rt.store, job_id)["input"] == {"order": "A-1"}

    with Runtime(
        store_url, tools=ToolRegistry([Tool("slow", lambda ctx: {}, "tool")]), lease_seconds=0.4
    ) as rt:
        job_id = rt.submit(plan(node("s", "slow")), {}).job_id
        crash_at("tool.after_execute")
        with pytest.raises(SimulatedCrash):
            rt.run_until_idle()
        wait_lease_expired(rt.store, job_id)  # (the run is dead: nobody holds the job)
        assert rt.get_job(job_id).status == "running"
        assert _state(rt.store, job_id, "s")["state"] == "in_flight"


def test_an_agent_s_tool_call_of_a_live_run_is_running(store_url: str) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(ctx: ToolContext) -> dict[str, Any]:
        entered.set()
        assert release.wait(30)
        return {"done": True}

    def fn(ctx: AgentContext) -> Any:
        return ctx.call("slow")

    tools = ToolRegistry([Tool("slow", slow, "tool"), Agent("slow_agent", fn, "1")])
    with Runtime(store_url, tools=tools) as rt:
        job_id = rt.submit("slow_agent", {}).job_id
        runner = threading.Thread(target=rt.run_job, args=(job_id,))
        runner.start()
        try:
            assert entered.wait(30)
            (step,) = job_trace(rt.store, job_id)["nodes"]
            assert step["state"] == "running" and step["idempotency_key"], step
        finally:
            release.set()
            runner.join(30)
        (step,) = job_trace(rt.store, job_id)["nodes"]
        assert step["state"] == "side_effect_committed"


@pytest.mark.parametrize("approved", [True, False])
def test_an_answered_approval_is_approved_or_denied(store_url: str, approved: bool) -> None:
    tools = ToolRegistry([Tool("echo", lambda ctx, ok: {"ok": ok}, "pure")])
    graph = plan(
        {"id": "ok", "type": "approval"},
        node("log", "echo", "pure", args={"ok": "${ok}"}, deps=["ok"]),
    )
    with Runtime(store_url, tools=tools, lease_seconds=5) as rt:
        job_id = rt.submit(graph, {}).job_id
        assert rt.run_job(job_id).status == "waiting"
        signal_job(rt.store, job_id, f"{job_id}:ok", {"approved": approved}, principal=ANN)
        rt.run_until_idle()
        assert rt.get_job(job_id).status == ("completed" if approved else "failed")
        step = _state(rt.store, job_id, "ok")
    assert step["state"] == ("approved" if approved else "denied")
    assert step["outcome"] == ("pure" if approved else "permanent_failure")


def test_an_agent_approval_denied_is_denied_and_shown_by_its_key(store: Store) -> None:
    log = AgentLog().start()
    log.wait("approval", "big_refund", None, answered=False)
    node_id, step_id = "#0", log.events[-2][1]["step_id"]
    log.add("wait_completed", node_id=node_id, correlation_key="big_refund",
            payload={"approved": False}, signalled_by="ann")  # fmt: skip
    denial = {"type": "not_approved", "message": "approval was denied"}
    log.add("node_finished", node_id=node_id, step_id=step_id, result_type="permanent_failure",
            error=denial, attempt=1, duration_ms=0)  # fmt: skip
    log.add("job_failed", error=denial, node_id=node_id)
    (step,) = job_trace(store, store_log(store, log, status="failed"))["nodes"]
    assert step["state"] == "denied" and step["key"] == "big_refund"


@pytest.fixture
def paying(store_url: str) -> Iterator[Callable[[bool], tuple[Runtime, dict[str, Any]]]]:
    opened: list[Runtime] = []

    def make(finds: bool) -> tuple[Runtime, dict[str, Any]]:
        effects: dict[str, Any] = {}

        def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
            effects[ctx.external_key] = {"paid": amount}
            return effects[ctx.external_key]

        def find(ctx: ToolContext, amount: int) -> Any:
            return effects.get(ctx.external_key) if finds else None

        tool = Tool("pay", pay, "tool", reconcile_fn=find)
        rt = Runtime(store_url, tools=ToolRegistry([tool]), lease_seconds=0.4)
        opened.append(rt)
        return rt, effects

    yield make
    for rt in opened:
        rt.close()


def _crashed_and_recovered(
    rt: Runtime, crash_at: Callable[[str], None], worker_after: str
) -> tuple[str, str, dict[str, Any]]:
    job_id = rt.submit(plan(node("p", "pay", args={"amount": 9})), {}).job_id
    crash_at("tool.after_execute")
    with pytest.raises(SimulatedCrash):
        rt.run_until_idle()
    dead = rt.worker.worker_id
    wait_lease_expired(rt.store, job_id)
    rt.worker.worker_id = worker_after  # (another worker takes the job over)
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    return job_id, dead, _state(rt.store, job_id, "p")


def test_a_call_caught_up_by_reconcile_is_shown_recovered_with_the_dead_attempts_worker(
    paying: Callable[[bool], tuple[Runtime, dict[str, Any]]],
    crash_at: Callable[[str], None],
    store_url: str,
) -> None:
    rt, effects = paying(True)
    job_id, dead, step = _crashed_and_recovered(rt, crash_at, "second-worker")
    assert len(effects) == 1  # (the tool acted once: reconcile found it)
    (recovered,) = step["recovered"]
    assert recovered["how"] == "caught_up"
    assert recovered["attempt"] == 1 and recovered["worker_id"] == dead
    assert [t["worker_id"] for t in step["tries"]] == [dead]
    shown = json.loads(cli("jobs", "show", job_id, "--db", store_url, "--json").stdout)
    assert [(r["node_id"], r["how"], r["worker_id"]) for r in shown["recovered"]] == [
        ("p", "caught_up", dead)
    ]
    for command in ("show", "trace"):
        human = cli("jobs", command, job_id, "--db", store_url)
        assert human.returncode == 0, human.stderr
        assert f"recovered p: caught up: attempt 1 (worker {dead})" in human.stdout, human.stdout


def test_a_call_reconcile_found_lost_is_shown_re_run_with_both_workers(
    paying: Callable[[bool], tuple[Runtime, dict[str, Any]]],
    crash_at: Callable[[str], None],
    store_url: str,
) -> None:
    rt, effects = paying(False)
    job_id, dead, step = _crashed_and_recovered(rt, crash_at, "second-worker")
    assert len(effects) == 2  # (the hook is told to find nothing: the step ran again)
    (recovered,) = step["recovered"]
    assert recovered["how"] == "rerun"
    assert recovered["attempt"] == 1 and recovered["worker_id"] == dead
    assert recovered["rerun_attempt"] == 2 and recovered["rerun_worker_id"] == "second-worker"
    assert step["attempts"] == 2
    assert [t["worker_id"] for t in step["tries"]] == ["second-worker"]
    human = cli("jobs", "trace", job_id, "--db", store_url).stdout
    assert "ran on worker second-worker" in " ".join(human.split()), human


def test_a_step_that_ran_once_lists_no_recovery(store: Store) -> None:
    log = AgentLog().start()
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 1})
    log.complete({"ok": True})
    (step,) = job_trace(store, store_log(store, log))["nodes"]
    assert step["recovered"] == [] and [t["worker_id"] for t in step["tries"]] == ["w1"]


def test_a_person_s_accepted_result_is_no_recovery(store: Store) -> None:
    log = AgentLog().start()
    log.tool("issue_refund", {"amount": 1}, None, in_flight=True)
    key = log.ledger[0].key
    base = {"node_id": "#0", "step_id": log.events[-1][1]["step_id"]}
    log.add("job_parked", reason="in_flight", idempotency_key=key, **base)
    log.add("tool_invocation_finished", **base, invocation_id=log.ledger[0].invocation_id,
            idempotency_key=key, outcome="success", result={"ok": 1}, catch_up=True)  # fmt: skip
    log.add("job_resumed", decision="accept_result", result={"ok": 1}, by="ann", note=None)
    (step,) = job_trace(store, store_log(store, log, status="pending"))["nodes"]
    assert step["recovered"] == []
