"""Approvals an agent cannot bypass, on SQLite and PostgreSQL: who may decide one (never the
submitter; approver or admin; the approval's `approvers`), two-person rules, and tools that
require approval of each call whatever the plan or the agent's code asks for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry, agent
from affidavit.core.approvals import ApprovalRefused, Principal, call_approval_key
from affidavit.core.errors import PlanError
from affidavit.faces.errors import http_status_for
from affidavit.runtime._decisions import signal_job
from affidavit.verify import verify_job
from tests.runtime.helpers import Calls, assert_log_sound, node, of_type, plan

ALICE = Principal("alice", "approver", "k-alice")
BOB = Principal("bob", "approver", "k-bob")
MALLORY = Principal("mallory", "approver", "k-mallory")  # the submitter, with an approver key
AGENT = Principal("eve", "agent", "k-eve")


def pay_tool(calls: Calls, **options: Any) -> Tool:
    def pay(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.add(ctx, "pay")
        return {"paid": amount}

    t = Tool("pay", pay, "tool")
    t.requires_approval = options.get("requires_approval", True)
    return t


@agent("approvals_spender")
def spender(ctx: Any, amount: int) -> Any:
    return ctx.call("pay", amount=amount)  # no ctx.approval: the tool asks for it


@agent("approvals_asker")
def asker(ctx: Any) -> Any:
    return ctx.approval("go", {"why": "test"}, approvers=["alice", "bob"], min_approvals=2)


@pytest.fixture
def rt(store_url: str, calls: Calls) -> Iterator[Runtime]:
    big = pay_tool(calls, requires_approval=lambda amount, **_: amount > 100)
    big.name = "pay_big"
    tools = ToolRegistry([pay_tool(calls), big, spender, asker])
    with Runtime(store_url, tools=tools, lease_seconds=5) as runtime:
        yield runtime


def approval_plan(**fields: Any) -> dict[str, Any]:
    return plan(
        {"id": "ok", "type": "approval", **fields},
        node("log", "echo", "pure", args={"ok": "${ok}"}, deps=["ok"]),
    )


@pytest.fixture
def echo_rt(store_url: str) -> Iterator[Runtime]:
    tools = ToolRegistry([Tool("echo", lambda ctx, ok: {"ok": ok}, "pure")])
    with Runtime(store_url, tools=tools, lease_seconds=5) as runtime:
        yield runtime


def waiting(rt: Runtime, graph: Any, job_input: Any = None) -> str:
    job_id = rt.submit(graph, job_input or {}, submitted_by="mallory").job_id
    assert rt.run_job(job_id).status == "waiting"
    return job_id


def test_the_submitter_and_agents_may_not_decide_an_approval(echo_rt: Runtime) -> None:
    job_id = waiting(echo_rt, approval_plan())
    key = f"{job_id}:ok"
    version = echo_rt.get_job(job_id).version
    for who, why in ((MALLORY, "submitted the job"), (AGENT, "role 'agent'"), (None, "--as")):
        with pytest.raises(ApprovalRefused) as refused:
            signal_job(echo_rt.store, job_id, key, {"approved": True}, principal=who)
        assert why in str(refused.value) + refused.value.hint
        assert http_status_for(refused.value) == 403  # (the faces: 403 Forbidden)
    assert echo_rt.get_job(job_id).version == version  # nothing recorded
    _, appended = signal_job(echo_rt.store, job_id, key, {"approved": True}, principal=ALICE)
    assert appended
    [done] = of_type(echo_rt.store.list_events(job_id), "wait_completed")
    assert done["signalled_by"] == "alice"
    assert [(d["principal"], d["role"], d["key_id"]) for d in done["decided_by"]] == [
        ("alice", "approver", "k-alice")
    ]
    assert echo_rt.run_job(job_id).status == "completed"
    assert verify_job(echo_rt.store, job_id).ok


def test_two_person_rule_counts_distinct_approvers(echo_rt: Runtime) -> None:
    job_id = waiting(echo_rt, approval_plan(min_approvals=2))
    key = f"{job_id}:ok"
    [asked] = of_type(echo_rt.store.list_events(job_id), "job_waiting")
    assert (asked["approvers"], asked["min_approvals"]) == (["approver", "admin"], 2)
    job, appended = signal_job(echo_rt.store, job_id, key, {"approved": True}, principal=ALICE)
    assert appended and job.status == "waiting"
    # the same approver again counts once: nothing is appended, the job still waits
    job, appended = signal_job(echo_rt.store, job_id, key, {"approved": True}, principal=ALICE)
    assert not appended and job.status == "waiting"
    assert echo_rt.run_until_idle() == 0
    job, appended = signal_job(
        echo_rt.store, job_id, key, {"approved": True, "comment": "second"}, principal=BOB
    )
    assert appended and job.status == "pending"
    events = echo_rt.store.list_events(job_id)
    [vote] = of_type(events, "approval_recorded")
    assert (vote["principal"], vote["approved"]) == ("alice", True)
    [done] = of_type(events, "wait_completed")
    assert [d["principal"] for d in done["decided_by"]] == ["alice", "bob"]
    assert done["payload"] == {"approved": True, "comment": "second"}
    assert echo_rt.run_job(job_id).status == "completed"
    assert_log_sound(echo_rt.store, job_id)


def test_one_rejection_by_an_allowed_principal_rejects(echo_rt: Runtime) -> None:
    job_id = waiting(echo_rt, approval_plan(min_approvals=2))
    key = f"{job_id}:ok"
    signal_job(echo_rt.store, job_id, key, {"approved": True}, principal=ALICE)
    signal_job(echo_rt.store, job_id, key, {"approved": False}, principal=BOB)
    job = echo_rt.run_job(job_id)
    assert job.status == "failed" and job.error["type"] == "not_approved"
    assert_log_sound(echo_rt.store, job_id)


def test_named_approvers_only(echo_rt: Runtime) -> None:
    job_id = waiting(echo_rt, approval_plan(approvers=["bob"]))
    key = f"{job_id}:ok"
    with pytest.raises(ApprovalRefused, match="not among"):
        signal_job(echo_rt.store, job_id, key, {"approved": True}, principal=ALICE)
    # a name in the list still needs an approving role
    with pytest.raises(ApprovalRefused, match="role 'agent'"):
        signal_job(
            echo_rt.store, job_id, key, {"approved": True}, principal=Principal("bob", "agent")
        )
    signal_job(echo_rt.store, job_id, key, {"approved": True}, principal=BOB)
    assert echo_rt.run_job(job_id).status == "completed"


@pytest.mark.parametrize(
    "fields",
    [{"approvers": []}, {"approvers": "bob"}, {"min_approvals": 0}, {"min_approvals": True},
     {"approvers": ["bob"], "min_approvals": 2}, {"approvers": ["agent"]}],
)  # fmt: skip
def test_a_malformed_approval_policy_is_refused_at_submit(echo_rt: Runtime, fields: Any) -> None:
    with pytest.raises(PlanError):
        echo_rt.submit(approval_plan(**fields), {})


def test_a_tool_that_requires_approval_waits_for_an_approval_of_that_call(
    rt: Runtime, calls: Calls
) -> None:
    """The plan has no approval node: the runtime asks for one, for exactly this call."""
    job_id = waiting(rt, plan(node("charge", "pay", args={"amount": 99_999_999})))
    assert calls.count(name="pay") == 0
    [asked] = of_type(rt.store.list_events(job_id), "job_waiting")
    call = asked["call"]
    assert (call["tool_name"], call["args"]) == ("pay", {"amount": 99_999_999})
    assert asked["correlation_key"] == call_approval_key(job_id, call["step_id"], call["args_hash"])
    assert rt.run_until_idle() == 0  # nothing runs it meanwhile
    with pytest.raises(ApprovalRefused):  # the submitter cannot approve it either
        signal_job(
            rt.store, job_id, asked["correlation_key"], {"approved": True}, principal=MALLORY
        )
    signal_job(rt.store, job_id, asked["correlation_key"], {"approved": True}, principal=ALICE)
    assert rt.run_job(job_id).status == "completed"
    assert calls.count(name="pay") == 1
    assert rt.run_until_idle() == 0 and calls.count(name="pay") == 1
    [started] = of_type(assert_log_sound(rt.store, job_id), "tool_invocation_started")
    assert started["requires_approval"] is True
    assert started["approval_key"] == asked["correlation_key"]


def test_a_plan_approval_node_does_not_stand_in_for_the_calls_own(
    rt: Runtime, calls: Calls
) -> None:
    graph = plan(
        {"id": "ok", "type": "approval"},
        node("charge", "pay", args={"amount": 5}, deps=["ok"]),
    )
    job_id = waiting(rt, graph)
    signal_job(rt.store, job_id, f"{job_id}:ok", {"approved": True}, principal=ALICE)
    assert rt.run_job(job_id).status == "waiting"  # now for the call itself
    assert calls.count(name="pay") == 0


def test_a_rejected_call_never_runs(rt: Runtime, calls: Calls) -> None:
    job_id = waiting(rt, plan(node("charge", "pay", args={"amount": 7})))
    [asked] = of_type(rt.store.list_events(job_id), "job_waiting")
    signal_job(rt.store, job_id, asked["correlation_key"], {"approved": False}, principal=ALICE)
    job = rt.run_job(job_id)
    assert job.status == "failed" and job.error["type"] == "not_approved"
    assert calls.count(name="pay") == 0
    assert_log_sound(rt.store, job_id)


def test_the_callable_form_asks_only_for_the_calls_it_names(rt: Runtime, calls: Calls) -> None:
    small = rt.submit(plan(node("charge", "pay_big", args={"amount": 50})), {}).job_id
    assert rt.run_job(small).status == "completed"
    assert calls.count(name="pay") == 1
    [started] = of_type(rt.store.list_events(small), "tool_invocation_started")
    assert "requires_approval" not in started
    big = waiting(rt, plan(node("charge", "pay_big", args={"amount": 150})))
    assert calls.count(name="pay") == 1
    [asked] = of_type(rt.store.list_events(big), "job_waiting")
    signal_job(rt.store, big, asked["correlation_key"], {"approved": True}, principal=BOB)
    assert rt.run_job(big).status == "completed"
    assert calls.count(name="pay") == 2
    assert_log_sound(rt.store, big)


def test_an_agent_that_skips_ctx_approval_waits_for_the_call_approval(
    rt: Runtime, calls: Calls
) -> None:
    job_id = rt.submit("approvals_spender", {"amount": 1_000_000}, submitted_by="mallory").job_id
    assert rt.run_job(job_id).status == "waiting"
    assert calls.count(name="pay") == 0
    [asked] = of_type(rt.store.list_events(job_id), "job_waiting")
    assert asked["call"]["args"] == {"amount": 1_000_000}
    with pytest.raises(ApprovalRefused):
        signal_job(
            rt.store, job_id, asked["correlation_key"], {"approved": True}, principal=MALLORY
        )
    signal_job(rt.store, job_id, asked["correlation_key"], {"approved": True}, principal=ALICE)
    job = rt.run_job(job_id)
    assert job.status == "completed", job.error
    assert job.output == {"paid": 1_000_000}
    assert calls.count(name="pay") == 1
    assert_log_sound(rt.store, job_id)


def test_ctx_approval_takes_approvers_and_min_approvals(rt: Runtime) -> None:
    job_id = rt.submit("approvals_asker", {}, submitted_by="mallory").job_id
    assert rt.run_job(job_id).status == "waiting"
    signal_job(rt.store, job_id, "go", {"approved": True}, principal=ALICE)
    with pytest.raises(ApprovalRefused, match="not among"):
        signal_job(
            rt.store, job_id, "go", {"approved": True}, principal=Principal("carol", "admin")
        )
    signal_job(rt.store, job_id, "go", {"approved": True}, principal=BOB)
    job = rt.run_job(job_id)
    assert job.status == "completed", job.error
    assert job.output == {"approved": True}
    assert_log_sound(rt.store, job_id)


@agent("approvals_starter")
def starter(ctx: Any) -> Any:
    other = ctx.start("slow", amount=1)  # needs no approval: started first
    gated = ctx.start("pay", amount=2)  # asks for one: only once `other` recorded its outcome
    return [h.result() for h in (other, gated)]


def test_a_call_that_asks_for_approval_does_not_cut_off_concurrent_steps(
    store_url: str, calls: Calls
) -> None:
    """Asking ends the run as a wait does: under step concurrency the asking node runs alone,
    and an agent's started calls record their outcome before it asks. `slow` holds on until
    its job waits (which a call asking beside it would make happen) or 2 s have passed."""
    store: list[Any] = []

    def slow(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.add(ctx, "slow")
        for _ in range(40):
            if store[0].get_job(ctx.job_id).status == "waiting":
                break
            threading.Event().wait(0.05)
        return {"paid": amount}

    tools = ToolRegistry([pay_tool(calls), Tool("slow", slow, "tool"), starter])
    graph = plan(node("free", "slow", args={"amount": 3}), node("gated", "pay", args={"amount": 4}))
    with Runtime(store_url, tools=tools, step_concurrency=3) as rt:
        store.append(rt.store)
        for job_id in (
            rt.submit(graph, {}, submitted_by="m").job_id,
            rt.submit("approvals_starter", {}, submitted_by="m").job_id,
        ):
            assert rt.run_job(job_id).status == "waiting"
            events = assert_log_sound(rt.store, job_id)
            # the invocation running beside it was closed before the job waited
            assert len(of_type(events, "tool_invocation_started")) == 1
            assert len(of_type(events, "tool_invocation_finished")) == 1
            [asked] = of_type(events, "job_waiting")
            signal_job(
                rt.store, job_id, asked["correlation_key"], {"approved": True}, principal=BOB
            )
            done = rt.run_job(job_id)
            assert done.status == "completed", done.error
            assert_log_sound(rt.store, job_id)
    assert (calls.count(name="slow"), calls.count(name="pay")) == (2, 2)


def test_the_decorator_takes_the_requirement_and_refuses_bad_options() -> None:
    from affidavit import tool
    from affidavit.core.errors import ConfigError

    @tool("approvals_refund", requires_approval=lambda amount, **_: amount > 100, min_approvals=2)
    def refund(ctx: ToolContext, amount: int) -> dict[str, Any]:
        return {"refunded": amount}

    assert refund.needs_approval({"amount": 101}) and not refund.needs_approval({"amount": 100})
    assert refund.needs_approval({"other": 1})  # a predicate that raises: approval required
    assert refund.approval_policy.min_approvals == 2
    for bad in ({"requires_approval": "yes"}, {"approvers": []}, {"min_approvals": 0}):
        with pytest.raises(ConfigError):
            tool("approvals_bad", **bad)  # type: ignore[arg-type]
