"""Pydantic AI agent delegation as child jobs, with the real library on both backends: a tool
marked ``durable=False`` that awaits ``helper.run(...)`` (``helper`` has its own
``AffidavitDurability``) starts the helper as a child job once and waits for it durably; a
worker killed while the parent creates, waits on or links the child leaves one child, every
tool effect once, the model not asked again for a recorded turn and a tree that verifies; a
child re-sealed with another output fails the parent's tree; a run inside an ordinary tool's
step is refused."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from affidavit import Runtime, ToolRegistry
from affidavit.store import JobFilter
from affidavit.verify import verify_job, verify_tree
from affidavit.verify.repair import seal_unsealed
from tests.integrations import pydai_sub_tools as st
from tests.integrations import pydai_tools as pt
from tests.integrations.child_crash import killed_then_finished, tree_verifies
from tests.integrations.test_pydantic_ai import step_calls
from tests.verify.helpers import RawDb

SUB_TOOLS = Path(st.__file__)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {"PYDAI_SIDE": str(tmp_path / "side.jsonl"), "PYDAI_LEDGER": str(tmp_path / "ledger")}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def _runtime(url: str) -> Runtime:
    return Runtime(url, tools=ToolRegistry(st.REGISTRATIONS), lease_seconds=30)


def _models(env: dict[str, str]) -> Counter[tuple[str, int]]:
    lines = pt.read_side(Path(env["PYDAI_SIDE"]))
    return Counter((line["agent"], line["turn"]) for line in lines if line["kind"] == "model")


def _tree_once(rt: Runtime, env: dict[str, str], root: str) -> str:
    """The boss completed with one helper child; every effect and model turn happened once."""
    job = rt.get_job(root)
    assert job.status == "completed", job.error
    assert job.output == {"output": "delegate=charged 7; note=noted"}
    [child] = rt.store.list_jobs(JobFilter(parent=root))  # created once, crash or not
    created = rt.store.list_events(child.job_id, limit=1)[0].payload
    assert (child.plan_name, created.get("input")) == ("pydai_helper", {"prompt": "charge 7"})
    assert created.get("parent_job_id") == root
    assert child.output == {"output": "charged 7"}
    ledger = Path(env["PYDAI_LEDGER"]).read_text().splitlines()
    assert [line.split()[0] for line in ledger] == ["7"]  # charged once
    lines = pt.read_side(Path(env["PYDAI_SIDE"]))
    assert [line["text"] for line in lines if line["kind"] == "note"] == ["paying 7"]
    assert _models(env) == Counter(
        {("boss", 0): 1, ("boss", 1): 1, ("helper", 0): 1, ("helper", 1): 1}
    )  # every model turn asked once, across every worker
    kinds = [(c["kind"], c["tool_name"]) for c in step_calls(rt, root)]
    assert kinds == [
        ("pure", "pydai_boss.model_request"),
        ("tool", "pydai_boss.tool.note"),
        ("job", None),
        ("join", None),
        ("pure", "pydai_boss.model_request"),
    ]  # (the delegating tool is no step of its own: its child job and join are)
    [started] = [c for c in step_calls(rt, root) if c["kind"] == "job"]
    assert started["args"] == {"agent": "pydai_helper", "input": {"prompt": "charge 7"}}
    return child.job_id


def test_a_delegated_run_is_a_child_job_joined_durably(store_url: str, env: Any) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("pydai_boss", {"prompt": "pay 7"}).job_id
        assert rt.run_job(root).status == "waiting"  # the boss holds no worker meanwhile
        [child] = rt.store.list_jobs(JobFilter(parent=root))
        assert child.status == "pending"
        rt.run_until_idle()
        child_id = _tree_once(rt, env, root)
        delegated = [x for x in pt.read_side(Path(env["PYDAI_SIDE"])) if x["kind"] == "delegated"]
        assert [x["child"] for x in delegated] == [child_id]  # the result names its child
        assert rt.run_job(root).status == "completed"  # run again: nothing runs again
        tree = verify_tree(rt.store, root)
        assert tree.ok, tree.to_dict()
        assert [r.job_id for r in tree.results] == [root, child_id]


@pytest.mark.parametrize(
    "point",
    [
        "child.after_create",  # the child exists; the boss has not recorded it
        "wait.after_record",  # the boss waits on the helper (no worker holds it)
        "tool.after_execute:2",  # the helper killed right after its charge (note is the 1st)
        "child.before_link",  # the helper ended; the boss has not recorded it
    ],
)
def test_a_worker_killed_around_the_sub_agent(store_url: str, env: Any, point: str) -> None:
    root = killed_then_finished(store_url, SUB_TOOLS, {"prompt": "pay 7"}, env, "pydai_boss", point)
    with _runtime(store_url) as rt:
        _tree_once(rt, env, root)
    if point == "tool.after_execute:2":  # the charge in flight was reconciled, not repeated
        lines = pt.read_side(Path(env["PYDAI_SIDE"]))
        assert [x["amount"] for x in lines if x["kind"] == "reconcile"] == [7]
    tree_verifies(store_url, root, jobs=2)


def test_a_child_resealed_with_another_output_fails_the_parents_tree(
    store_url: str, env: Any
) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("pydai_boss", {"prompt": "pay 7"}).job_id
        rt.run_until_idle()
        child = _tree_once(rt, env, root)
        raw = RawDb(store_url)
        rows = []
        for _, event_id, event_type, payload, _ in raw.events(child):
            if event_type == "job_completed":
                doc = orjson.loads(payload)
                doc["output"] = {"output": "charged 0"}
                payload = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
            rows.append((event_id, event_type, payload))
        raw.rewrite_log(child, rows)
        raw.execute(
            "UPDATE jobs SET output = ? WHERE job_id = ?", ('{"output":"charged 0"}', child)
        )
        raw.execute("DELETE FROM seals WHERE job_id = ?", (child,))
        assert [s.job_id for s in seal_unsealed(rt.store, rt.sealer).sealed] == [child]
        assert verify_job(rt.store, child).ok  # on its own, the forged child holds together
        tree = verify_tree(rt.store, root)
        assert not tree.ok
        (bad,) = [link for link in tree.links if link.problem]
        assert bad.child_job_id == child and "chain_head" in bad.problem


@pytest.mark.parametrize("parent", ["pydai_plain_boss", "pydai_sync_boss"])
def test_an_affidavit_agent_function_delegates_too(store_url: str, env: Any, parent: str) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit(parent, {"amount": 4}).job_id
        assert rt.run_job(root).status == "waiting"
        rt.run_until_idle()
        job = rt.get_job(root)
        assert job.status == "completed", job.error
        assert job.output == {"output": "charged 4"}
        assert [c["kind"] for c in step_calls(rt, root)] == ["job", "join"]
        [child] = rt.store.list_jobs(JobFilter(parent=root))
        assert child.output == {"output": "charged 4"}
        assert verify_tree(rt.store, root).ok


def test_a_failed_child_is_an_exception_the_parent_may_catch(store_url: str, env: Any) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("pydai_boss", {"prompt": "pay -1"}).job_id
        rt.run_until_idle()
        job = rt.get_job(root)
        assert job.status == "completed", job.error
        assert job.output == {"output": "delegate=failed; note=noted"}
        [child] = rt.store.list_jobs(JobFilter(parent=root))
        assert child.status == "failed" and "the helper cannot" in str(child.error)
        assert verify_tree(rt.store, root).ok


def test_a_sub_agent_run_inside_a_tool_step_is_refused(store_url: str, env: Any) -> None:
    """An ordinary tool is an at-most-once step: a child job it waited on would keep it in
    flight. The run is refused before the helper starts; no child is created."""
    with _runtime(store_url) as rt:
        root = rt.submit("pydai_boss", {"prompt": "inline"}).job_id
        rt.run_until_idle()
        job = rt.get_job(root)
        assert job.status == "failed", job
        assert "durable=False" in json.dumps(job.error)
        assert rt.store.list_jobs(JobFilter(parent=root)) == []
        assert ("helper", 0) not in _models(env)


def test_outside_a_job_the_delegation_runs_in_process(env: Any) -> None:
    """No job, no child: both agents run as they would without the capability."""
    result = st.boss.run_sync("pay 5")
    assert result.output == "delegate=charged 5; note=noted"
