"""Fork / re-run from a step, on SQLite and PostgreSQL: the reused prefix never runs again, the
rest runs with the tools registered now, the fork verifies (and its reuse is checked against the
source's record), and a fork that cannot be made writes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from affidavit import AgentContext, Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.errors import ForkRefused
from affidavit.core.plan import Plan
from affidavit.packs import export_pack
from affidavit.packs.verify import verify_pack
from affidavit.runtime._agent import Agent
from affidavit.verify import check_fork, verify_events, verify_job
from tests.runtime.helpers import Calls, assert_log_sound, ledger_rows, node, of_type, plan
from tests.verify.helpers import RawDb

FIVE = plan(
    node("s1", "charge", args={"amount": "${input.amount}"}),
    node("s2", "charge", args={"amount": 2}, deps=["s1"]),
    node("s3", "add", "pure", args={"a": "${s1}", "b": "${s2}"}, deps=["s2"]),
    node("s4", "charge", args={"amount": "${s3.total}"}, deps=["s3"]),
    node("s5", "charge", args={"amount": "${input.amount}"}, deps=["s4"]),
)


def tools(calls: Calls, bonus: int = 0) -> list[Tool]:
    def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.add(ctx, "charge")
        return {"charged": amount + bonus}

    def add(ctx: ToolContext, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        calls.add(ctx, "add")
        return {"total": a["charged"] + b["charged"]}

    return [Tool("charge", charge, "tool"), Tool("add", add, "pure")]


@pytest.fixture
def make_runtime(store_url: str) -> Iterator[Callable[..., Runtime]]:
    opened: list[Runtime] = []

    def make(*registered: Tool) -> Runtime:
        rt = Runtime(store_url, tools=ToolRegistry(registered), lease_seconds=5)
        opened.append(rt)
        return rt

    yield make
    for rt in opened:
        rt.close()


def _source(make_runtime: Callable[..., Runtime], calls: Calls) -> tuple[Runtime, str]:
    rt = make_runtime(*tools(calls))
    job_id = rt.submit(FIVE, {"amount": 1}).job_id
    rt.run_until_idle()
    assert rt.store.get_job(job_id).status == "completed"  # type: ignore[union-attr]
    assert calls.count() == 5
    return rt, job_id


def test_fork_from_step_3_runs_only_steps_4_and_5(
    make_runtime: Callable[..., Runtime], calls: Calls
) -> None:
    _, source = _source(make_runtime, calls)
    fixed = Calls()  # the code deployed now: another charge tool, counted apart
    now = make_runtime(*tools(fixed, bonus=100))
    fork = now.fork(source, "s3", {"amount": 7})
    now.run_until_idle()
    assert now.store.get_job(fork.job_id).status == "completed"  # type: ignore[union-attr]
    assert fixed.count(node_id="s4") == 1 and fixed.count(node_id="s5") == 1
    assert fixed.count() == 2  # s1, s2 (effects) and s3 never ran again
    assert calls.count() == 5  # nor did the source's tools
    events = assert_log_sound(now.store, fork.job_id)
    forked = events[0].payload["forked_from"]
    assert (forked["job_id"], forked["step"]) == (source, "s3")
    assert [r["node_id"] for r in forked["reused"]] == ["s1", "s2", "s3"]
    # the ledger of the fork holds only the effects that ran in it
    assert sorted(r.node_id for r in ledger_rows(now.store, fork.job_id)) == ["s4", "s5"]
    started = {p["node_id"] for p in of_type(events, "node_started")}
    assert started == {"s4", "s5"}
    # s4 used the recorded s3 (1 + 2 = 3) and s5 the new input
    output = events[-1].payload["output"]
    assert output == {"s5": {"charged": 107}}
    report = verify_job(now.store, fork.job_id)
    assert report.ok, report
    checked = check_fork(now.store, fork.job_id)
    assert checked is not None and checked.status == "verified", checked


def test_fork_by_step_id_keeps_the_input(
    make_runtime: Callable[..., Runtime], calls: Calls
) -> None:
    rt, source = _source(make_runtime, calls)
    step_id = rt.store.list_events(source)[2].payload["step_id"]
    fork = rt.fork(source, step_id)
    rt.run_until_idle()
    events = rt.store.list_events(fork.job_id)
    assert events[0].payload["input"] == {"amount": 1}
    assert events[0].payload["forked_from"]["step"] == "s1"
    assert calls.count() == 5 + 4


def test_fork_refused_for_an_unsealed_job_or_an_unknown_step(
    make_runtime: Callable[..., Runtime], calls: Calls
) -> None:
    rt = make_runtime(*tools(calls))
    pending = rt.submit(FIVE, {"amount": 1}).job_id
    count = len(rt.store.list_jobs())
    with pytest.raises(ForkRefused, match="no seal"):
        rt.fork(pending, "s3")
    rt.run_until_idle()
    with pytest.raises(ForkRefused, match="no step 'nope'"):
        rt.fork(pending, "nope")
    assert len(rt.store.list_jobs()) == count


def test_a_fork_with_an_edited_copied_result_fails(
    make_runtime: Callable[..., Runtime], calls: Calls, store_url: str
) -> None:
    rt, source = _source(make_runtime, calls)
    fork = rt.fork(source, "s3").job_id
    rt.run_until_idle()
    assert verify_job(rt.store, fork).ok
    raw = RawDb(store_url)
    rows = raw.events(fork)
    created = orjson.loads(rows[0][3])
    created["forked_from"]["reused"][0]["output"] = {"charged": 1000}
    edited = orjson.dumps(created)
    # edited in place: the chain breaks
    raw.set_payload(fork, 1, edited)
    assert not verify_job(rt.store, fork).ok
    checked = check_fork(rt.store, fork)
    assert checked is not None and checked.status == "failed"
    assert "'s1'" in (checked.problem or "")
    # re-chained by a forger: the seal, and the reference check, still fail
    raw.rewrite_log(fork, [(e, t, edited if v == 1 else p) for v, e, t, p, _ in rows])
    assert not verify_job(rt.store, fork).ok
    assert check_fork(rt.store, fork).status == "failed"  # type: ignore[union-attr]


def test_without_its_source_the_prefix_is_unverified_by_reference(
    make_runtime: Callable[..., Runtime], calls: Calls, store_url: str
) -> None:
    rt, source = _source(make_runtime, calls)
    fork = rt.fork(source, "s3").job_id
    rt.run_until_idle()
    # a record copied without its source: the source job is unknown here
    raw = RawDb(store_url)
    rows = raw.events(fork)
    created = orjson.loads(rows[0][3])
    created["forked_from"]["job_id"] = "job-elsewhere"
    raw.set_payload(fork, 1, orjson.dumps(created))
    checked = check_fork(rt.store, fork)
    assert checked is not None and checked.status == "unverified" and checked.ok
    assert check_fork(rt.store, source) is None


def _agent_tools(calls: Calls, bonus: int = 0) -> list[Tool]:
    def charge(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.add(ctx, "charge")
        return {"charged": amount + bonus}

    return [Tool("ag_charge", charge, "tool")]


def _five_calls(version: str, step: int) -> Agent:
    """Five charges, #0..#4; the later ones use the results of the earlier ones."""

    def fn(ctx: AgentContext, amount: int) -> Any:
        out = [ctx.call("ag_charge", amount=amount)]
        out.append(ctx.call("ag_charge", amount=2))
        out.append(ctx.call("ag_charge", amount=out[0]["charged"] + out[1]["charged"]))
        out.append(ctx.call("ag_charge", amount=out[2]["charged"] + step))
        out.append(ctx.call("ag_charge", amount=amount + step))
        return [o["charged"] for o in out]

    return Agent("five", fn, version)


def test_an_agent_fork_from_step_3_runs_only_steps_4_and_5(store_url: str) -> None:
    calls, fixed = Calls(), Calls()
    with Runtime(store_url, tools=ToolRegistry([*_agent_tools(calls), _five_calls("1", 0)])) as rt:
        source = rt.submit("five", {"amount": 1}).job_id
        assert rt.run_job(source).status == "completed"
        assert calls.count() == 5
    # the code deployed now: version 2 of the agent decides calls 4 and 5 differently
    now = ToolRegistry([*_agent_tools(fixed, bonus=100), _five_calls("2", 10)])
    with Runtime(store_url, tools=now) as rt:
        with pytest.raises(ForkRefused, match="no step '#9'"):
            rt.fork(source, "#9")
        fork = rt.fork(source, "#2", {"amount": 1})  # step 3 is #2 (0-based)
        assert rt.run_job(fork.job_id).status == "completed"
        assert calls.count() == 5 and fixed.count() == 2
        assert {fixed.count(node_id="#3"), fixed.count(node_id="#4")} == {1}
        events = assert_log_sound(rt.store, fork.job_id)
        forked = events[0].payload["forked_from"]
        assert (forked["job_id"], forked["step"]) == (source, "#2")
        assert [p["seq"] for p in of_type(events, "step_called")] == [3, 4]
        assert sorted(r.node_id for r in ledger_rows(rt.store, fork.job_id)) == ["#3", "#4"]
        # #0..#2 are the recorded 1, 2, 3; #3 charged 3 + 10 (+100), #4 1 + 10 (+100)
        assert events[-1].payload["output"] == [1, 2, 3, 113, 111]
        assert verify_job(rt.store, fork.job_id).ok
        checked = check_fork(rt.store, fork.job_id)
        assert checked is not None and checked.status == "verified", checked


def test_a_forks_proof_pack_verifies(
    make_runtime: Callable[..., Runtime], calls: Calls, tmp_path: Path
) -> None:
    rt, source = _source(make_runtime, calls)
    fork = rt.fork(source, "s3").job_id
    rt.run_until_idle()
    export_pack(rt.store, fork, tmp_path / "pack")
    verdict = verify_pack(tmp_path / "pack")
    assert verdict.verdict == "MATCH", verdict.errors


def _log_of(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    return [
        {"version": e.version, "event_id": e.event_id, "type": e.type, "payload": e.payload}
        for e in rt.store.list_events(job_id)
    ]


def _rechained(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` renumbered and chained again (what a forger can always do)."""
    head = GENESIS
    out = []
    for version, e in enumerate(events, start=1):
        data = canonical(e["payload"])
        head = chain_next(head, e["event_id"], e["type"], data)
        out.append({**e, "version": version, "payload": data, "chain_hash": head.hex()})
    return out


def test_a_reused_step_that_runs_again_in_the_fork_fails(
    make_runtime: Callable[..., Runtime], calls: Calls
) -> None:
    rt, source = _source(make_runtime, calls)
    fork = rt.fork(source, "s3").job_id
    rt.run_until_idle()
    log = _log_of(rt, fork)
    assert verify_events(_rechained(log), status="completed", job_id=fork).replay_proof_result.ok
    started = next(e for e in log if e["type"] == "node_started")
    graph = log[1]["payload"]["task_graph"]
    s2 = Plan.of_recorded_graph(graph, log[1]["payload"]["plan_hash"]).step_ids(fork)["s2"]
    rerun = {**started, "event_id": "f" * 32,
             "payload": {**started["payload"], "node_id": "s2", "step_id": s2}}  # fmt: skip
    broken = verify_events(_rechained([*log[:2], rerun, *log[2:]]), status="completed", job_id=fork)
    assert broken.replay_proof_result.error.startswith("not_rerun"), broken.replay_proof_result
    # a reused node that is not in the plan, or out of its dependencies' order, fails too
    created = log[0]["payload"]
    for reused in (
        [{"node_id": "zz", "step_id": "0" * 16, "output": None}],
        list(reversed(created["forked_from"]["reused"])),
    ):
        edited = {**log[0], "payload": {**created, "forked_from": {
            **created["forked_from"], "reused": reused}}}  # fmt: skip
        result = verify_events(_rechained([edited, *log[1:]]), status="completed", job_id=fork)
        assert not result.replay_proof_result.ok, reused


def test_a_fork_of_a_fork_and_a_fork_asked_for_while_running(
    make_runtime: Callable[..., Runtime], calls: Calls
) -> None:
    rt, source = _source(make_runtime, calls)
    first = rt.fork(source, "s3").job_id
    rt.run_until_idle()
    second = rt.fork(first, "s4").job_id  # reuses s1..s3 (copied in first) and s4 (run there)
    rt.run_until_idle()
    assert calls.count() == 5 + 2 + 1
    assert verify_job(rt.store, second).ok
    checked = check_fork(rt.store, second)
    assert checked is not None and checked.status == "verified", checked
    refusals: list[str] = []

    def during(ctx: ToolContext) -> dict[str, Any]:
        with pytest.raises(ForkRefused, match="running, not finished") as refused:
            rt.fork(ctx.job_id, "a")
        refusals.append(str(refused.value))
        return {}

    rt.tools.add(Tool("during", during, "tool"))
    running = rt.submit({"name": "r", "nodes": [{"id": "a", "type": "tool", "tool": "during"}]})
    rt.run_until_idle()
    assert len(refusals) == 1
    assert rt.store.get_job(running.job_id).status == "completed"  # type: ignore[union-attr]
