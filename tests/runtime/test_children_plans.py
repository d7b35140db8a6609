"""A plan's ``job`` node, on both backends: it creates its child (an agent, or a plan file)
once, with ``${...}`` references in its input, waits without a worker, and its output is the
child's result; a malformed job node is refused on submit, changing nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit import PlanError, Runtime
from affidavit.store import JobFilter
from affidavit.store.queue_grants import job_queue_claims
from affidavit.store.queues import queue_config, recorded_grants, set_queue
from affidavit.verify import verify_tree
from tests.runtime import child_agents as ca
from tests.runtime.helpers import assert_log_sound


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    ca.CALLS.clear()
    with Runtime(store_url, tools=ca.registry(), lease_seconds=30) as runtime:
        yield runtime


def test_a_job_node_runs_a_child_agent_and_a_child_plan(rt: Runtime, tmp_path: Path) -> None:
    child_plan = tmp_path / "child.json"
    child_plan.write_text(json.dumps({"nodes": [
        {"id": "r", "type": "tool", "tool": "ch_refund", "args": {"order_id": "${input.o}"}},
    ]}))  # fmt: skip
    plan = {"nodes": [
        {"id": "first", "type": "job", "agent": "ch_refund_agent",
         "input": {"order_id": "${input.order}"}},
        {"id": "second", "type": "job", "plan": str(child_plan),
         "input": {"o": "${first.output.refunded}-again"}, "depends_on": ["first"]},
        {"id": "bad", "type": "job", "agent": "ch_refund_agent", "input": {"order_id": "BAD-2"}},
    ]}  # fmt: skip
    job = rt.submit(plan, {"order": "P-1"})
    rt.run_until_idle()
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output["second"]["status"] == "completed"
    assert done.output["second"]["output"] == {"r": {"refunded": "P-1-again"}}
    assert done.output["bad"]["status"] == "failed"
    assert ca.CALLS == {"P-1": 1, "P-1-again": 1}
    assert len(rt.store.list_jobs(JobFilter(parent=job.job_id))) == 3
    assert_log_sound(rt.store, job.job_id)
    tree = verify_tree(rt.store, job.job_id)
    assert tree.ok, tree.to_dict()
    assert len(tree.results) == 4


@pytest.mark.parametrize(
    ("node", "fragment"),
    [
        ({"id": "j", "type": "job", "input": {}}, "exactly one of `agent`"),
        ({"id": "j", "type": "job", "agent": "a", "plan": "p.yaml"}, "exactly one of `agent`"),
        ({"id": "j", "type": "job", "agent": "a", "args": {}}, "not `args`"),
        ({"id": "j", "type": "pure", "tool": "t", "agent": "a"}, "only a job node"),
        ({"id": "j", "type": "pure", "tool": "t", "queue": "q"}, "only a job node"),
        ({"id": "j", "type": "job", "agent": "a", "queue": 7}, "`queue` is the name"),
        ({"id": "j", "type": "job", "agent": "a", "queue": "${input.q}"}, "no \\$\\{"),
        ({"id": "j", "type": "job", "agent": "a", "queue": "no-such"}, "no queue 'no-such'"),
        ({"id": "j", "type": "job", "agent": "a", "queue": "bad name!"}, "not a queue name"),
    ],
)
def test_a_malformed_job_node_is_refused(rt: Runtime, node: dict, fragment: str) -> None:
    with pytest.raises(PlanError, match=fragment):
        rt.submit({"nodes": [node]}, {})
    assert rt.store.list_jobs() == []


def test_a_job_node_runs_its_child_in_the_queue_it_names(rt: Runtime, store_url: str) -> None:
    set_queue(rt.store, queue_config("tree-refunds", concurrency=1))
    plan = {"nodes": [
        {"id": "a", "type": "job", "agent": "ch_refund_agent", "input": {"order_id": "Q-1"},
         "queue": "tree-refunds"},
        {"id": "b", "type": "job", "agent": "ch_refund_agent", "input": {"order_id": "Q-2"},
         "queue": "tree-refunds"},
    ]}  # fmt: skip
    job = rt.submit(plan, {})
    # a worker that serves only the default queue runs the parent, never its children
    with Runtime(store_url, tools=ca.registry(), queues=["default"]) as default_only:
        default_only.run_until_idle()
    assert rt.store.get_job(job.job_id).status == "waiting"
    [first] = rt.store.list_jobs(JobFilter(parent=job.job_id))  # (the nodes run in order)
    assert first.status == "pending" and ca.CALLS == {}
    rt.run_until_idle()  # serves every queue: the children run there, one at a time
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert ca.CALLS == {"Q-1": 1, "Q-2": 1}
    children = [j.job_id for j in rt.store.list_jobs(JobFilter(parent=job.job_id))]
    granted = [g["job_id"] for g in recorded_grants(rt.store, "tree-refunds", 0) if g["started"]]
    assert sorted(granted) == sorted(children)  # each child held the queue's one slot
    for child in children:
        assert [c["ended_as"] for c in job_queue_claims(rt.store, child, time.time())] == [
            "completed"
        ]
    assert [c["ended_as"] for c in job_queue_claims(rt.store, job.job_id, time.time())] == []
    tree = verify_tree(rt.store, job.job_id)
    assert tree.ok, tree.to_dict()
