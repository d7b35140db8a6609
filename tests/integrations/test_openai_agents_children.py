"""OpenAI Agents SDK agents as tools as child jobs, with the real SDK on both backends: inside
``AffidavitRunner.run``, a tool made by ``refunder.as_tool(...)`` (the refunder registered with
``agent_job``) starts the refunder as a child job once per call and waits for it durably; a
worker killed while the parent creates, waits on or links the child leaves one child, every
tool effect once, the model not asked again for a recorded turn and a tree that verifies; a
failed child is the SDK's tool error for the model; a re-sealed child fails the parent's tree."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

import affidavit
from affidavit import Runtime, ToolRegistry
from affidavit.integrations.openai_agents import agent_job
from affidavit.store import JobFilter
from affidavit.verify import verify_job, verify_tree
from affidavit.verify.repair import seal_unsealed
from tests.integrations import oai_sub_tools as st
from tests.integrations import oai_tools as ot
from tests.integrations.child_crash import killed_then_finished, tree_verifies
from tests.integrations.test_pydantic_ai import step_calls
from tests.verify.helpers import RawDb

SUB_TOOLS = Path(st.__file__)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {"OAI_SIDE": str(tmp_path / "side.jsonl"), "OAI_LEDGER": str(tmp_path / "ledger")}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def _runtime(url: str) -> Runtime:
    return Runtime(url, tools=ToolRegistry(st.REGISTRATIONS), lease_seconds=30)


def _models(env: dict[str, str]) -> Counter[tuple[str, int]]:
    lines = ot.read_side(Path(env["OAI_SIDE"]))
    return Counter((line["agent"], line["turn"]) for line in lines if line["kind"] == "model")


def _tree_once(rt: Runtime, env: dict[str, str], root: str) -> str:
    """The triage job completed with one refunder child; every effect and turn happened once."""
    job = rt.get_job(root)
    assert job.status == "completed", job.error
    assert job.output == {"output": "noted; refunded 7"}
    [child] = rt.store.list_jobs(JobFilter(parent=root))  # created once, crash or not
    created = rt.store.list_events(child.job_id, limit=1)[0].payload
    assert (child.plan_name, created.get("input")) == ("oai_refunder", {"input": "refund 7"})
    assert child.output == {"final_output": "refunded 7"}
    ledger = Path(env["OAI_LEDGER"]).read_text().splitlines()
    assert [line.split()[0] for line in ledger] == ["7"]  # refunded once
    lines = ot.read_side(Path(env["OAI_SIDE"]))
    assert [line["text"] for line in lines if line["kind"] == "note"] == ["triage refund 7"]
    assert _models(env) == Counter(
        {("triage", 0): 1, ("triage", 1): 1, ("refunder", 0): 1, ("refunder", 1): 1}
    )  # every model turn asked once, across every worker
    kinds = [(c["kind"], c["tool_name"]) for c in step_calls(rt, root)]
    assert kinds == [
        ("pure", "openai_agents.model_response"),
        ("tool", "openai_agents.call_tool"),
        ("job", None),
        ("join", None),
        ("pure", "openai_agents.model_response"),
    ]  # (the agent tool is no tool step of its own: its child job and join are)
    child_kinds = [(c["kind"], c["tool_name"]) for c in step_calls(rt, child.job_id)]
    assert child_kinds == [
        ("pure", "openai_agents.model_response"),
        ("tool", "oai_refund"),
        ("pure", "openai_agents.model_response"),
    ]
    return child.job_id


def test_an_agent_tool_is_a_child_job_joined_durably(store_url: str, env: Any) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("oai_sub_triage", {"prompt": "refund 7"}).job_id
        assert rt.run_job(root).status == "waiting"  # the triage job holds no worker meanwhile
        rt.run_until_idle()
        child = _tree_once(rt, env, root)
        assert rt.run_job(root).status == "completed"  # run again: nothing runs again
        tree = verify_tree(rt.store, root)
        assert tree.ok, tree.to_dict()
        assert [r.job_id for r in tree.results] == [root, child]


@pytest.mark.parametrize(
    "point",
    [
        "child.after_create",  # the child exists; the parent has not recorded it
        "wait.after_record",  # the parent waits on the refunder (no worker holds it)
        "tool.after_execute:2",  # the refunder killed right after its refund (note is the 1st)
        "child.before_link",  # the refunder ended; the parent has not recorded it
    ],
)
def test_a_worker_killed_around_the_agent_tool(store_url: str, env: Any, point: str) -> None:
    root = killed_then_finished(
        store_url, SUB_TOOLS, {"prompt": "refund 7"}, env, "oai_sub_triage", point
    )
    with _runtime(store_url) as rt:
        _tree_once(rt, env, root)
    if point == "tool.after_execute:2":  # the refund in flight was reconciled, not repeated
        lines = ot.read_side(Path(env["OAI_SIDE"]))
        assert [x["amount"] for x in lines if x["kind"] == "reconcile"] == [7]
    tree_verifies(store_url, root, jobs=2)


def test_a_failed_child_is_the_tools_error_for_the_model(store_url: str, env: Any) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("oai_sub_triage", {"prompt": "fail"}).job_id
        rt.run_until_idle()
        job = rt.get_job(root)
        assert job.status == "completed", job.error
        [child] = rt.store.list_jobs(JobFilter(parent=root))
        assert child.status == "failed"
        assert job.output["output"].startswith("noted; An error occurred")
        assert verify_tree(rt.store, root).ok


def test_a_child_resealed_with_another_output_fails_the_parents_tree(
    store_url: str, env: Any
) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("oai_sub_triage", {"prompt": "refund 7"}).job_id
        rt.run_until_idle()
        child = _tree_once(rt, env, root)
        raw = RawDb(store_url)
        rows = []
        forged = {"final_output": "refunded 0"}
        for _, event_id, event_type, payload, _ in raw.events(child):
            if event_type == "job_completed":
                doc = orjson.loads(payload)
                doc["output"] = forged
                payload = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
            rows.append((event_id, event_type, payload))
        raw.rewrite_log(child, rows)
        raw.execute(
            "UPDATE jobs SET output = ? WHERE job_id = ?",
            (json.dumps(forged, separators=(",", ":")), child),
        )
        raw.execute("DELETE FROM seals WHERE job_id = ?", (child,))
        report = seal_unsealed(rt.store, rt.sealer)
        assert [s.job_id for s in report.sealed] == [child], report.refused
        assert verify_job(rt.store, child).ok  # on its own, the forged child holds together
        tree = verify_tree(rt.store, root)
        assert not tree.ok
        (bad,) = [link for link in tree.links if link.problem]
        assert bad.child_job_id == child and "chain_head" in bad.problem


def test_two_sdk_agents_of_one_name_are_refused() -> None:
    from agents import Agent

    # (the same agent with the same options: found)
    assert agent_job(st.refunder, name="oai_refunder", run_config=ot.QUIET) is st.refunder_job
    with pytest.raises(affidavit.ConfigError, match="registered as the job 'oai_refunder'"):
        agent_job(Agent(name="refunder"), name="oai_refunder_2")


def _handed_off_once(rt: Runtime, env: dict[str, str], root: str) -> None:
    """The front job completed as the refunder (a child job); every effect and turn once."""
    job = rt.get_job(root)
    assert job.status == "completed", job.error
    assert job.output == {"output": "refunded 7", "last_agent": "refunder"}  # the SDK's RunResult
    [child] = rt.store.list_jobs(JobFilter(parent=root))
    handed = rt.store.list_events(child.job_id, limit=1)[0].payload["input"]["input"]
    assert [i.get("role") or i.get("type") for i in handed] == [
        "user", "function_call", "function_call_output"
    ]  # (the conversation handed to it: the prompt and the handoff)  # fmt: skip
    assert child.output == {"final_output": "refunded 7"}
    ledger = Path(env["OAI_LEDGER"]).read_text().splitlines()
    assert [line.split()[0] for line in ledger] == ["7"]
    assert _models(env) == Counter({("front", 0): 1, ("refunder", 0): 1, ("refunder", 1): 1})
    kinds = [(c["kind"], c["tool_name"]) for c in step_calls(rt, root)]
    assert kinds == [("pure", "openai_agents.model_response"), ("job", None), ("join", None)]
    tree = verify_tree(rt.store, root)
    assert tree.ok, tree.to_dict()


def test_a_handoff_to_a_registered_agent_is_a_child_job(store_url: str, env: Any) -> None:
    with _runtime(store_url) as rt:
        root = rt.submit("oai_front", {"prompt": "refund 7"}).job_id
        assert rt.run_job(root).status == "waiting"
        rt.run_until_idle()
        _handed_off_once(rt, env, root)


@pytest.mark.parametrize("point", ["wait.after_record", "tool.after_execute"])
def test_a_worker_killed_around_a_handoff(store_url: str, env: Any, point: str) -> None:
    root = killed_then_finished(
        store_url, SUB_TOOLS, {"prompt": "refund 7"}, env, "oai_front", point
    )
    with _runtime(store_url) as rt:
        _handed_off_once(rt, env, root)
