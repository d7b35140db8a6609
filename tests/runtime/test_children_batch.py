"""``ctx.start_jobs``, on both backends: a batch of children created in one transaction, its
steps the ones as many ``ctx.start_job`` calls record (either code replays the other's
record), its bounds refused before anything is recorded."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from affidavit import Runtime, ToolRegistry
from affidavit.store import JobFilter
from affidavit.verify import verify_tree
from tests.runtime import child_agents as ca
from tests.runtime.helpers import assert_log_sound, of_type


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    ca.CALLS.clear()
    with Runtime(store_url, tools=ca.registry(), lease_seconds=30) as runtime:
        yield runtime


def steps_of(rt: Runtime, job_id: str) -> list[tuple[object, ...]]:
    """The job's steps as its record has them, less the ids of the job and its children."""
    events = rt.store.list_events(job_id)
    steps = []
    for e in events:
        if e.type in ("step_called", "node_finished"):
            kind = e.payload.get("kind")  # (a join's args are the children's ids)
            args = None if kind == "join" else e.payload.get("args")
            steps.append((e.type, e.payload.get("node_id"), kind, args))
    return steps


def test_a_batch_creates_each_child_once_and_records_what_start_job_records(
    rt: Runtime,
) -> None:
    orders = ["A", "BAD-1", "C", "D"]
    batch = rt.submit(ca.batch, {"orders": orders}).job_id
    loop = rt.submit(ca.parent, {"orders": orders}).job_id
    rt.run_until_idle()
    done = rt.store.get_job(batch)
    assert done.status == "completed", done.error
    assert done.output == [
        {**r, "job_id": b["job_id"]}
        for r, b in zip(rt.store.get_job(loop).output, done.output, strict=True)
    ]
    assert [r["status"] for r in done.output] == ["completed", "failed", "completed", "completed"]
    assert ca.CALLS == {"A": 2, "C": 2, "D": 2}  # (once per parent)
    events = assert_log_sound(rt.store, batch)
    started = [e.payload for e in events if e.type == "node_finished"][: len(orders)]
    children = rt.store.list_jobs(JobFilter(parent=batch))
    assert sorted(c.job_id for c in children) == sorted(r["job_id"] for r in done.output)
    for s, r in zip(started, done.output, strict=True):
        assert s["output"]["job_id"] == r["job_id"]
        created = rt.store.list_events(r["job_id"], limit=2)
        assert created[0].payload["parent_step_id"] == s["step_id"]
        assert (s["output"]["created_chain_head"], s["output"]["created_event_count"]) == (
            created[-1].chain_hash,
            2,
        )
    assert steps_of(rt, batch) == steps_of(rt, loop)
    assert len(of_type(events, "child_completed")) == len(orders)
    tree = verify_tree(rt.store, batch)
    assert tree.ok, tree.to_dict()
    assert len(tree.results) == 1 + len(orders)


def test_a_batch_replays_the_record_of_start_job_calls(store_url: str) -> None:
    """A parent recorded by ``start_job`` calls, then run by code that batches the same steps
    (the same agent name and version): it replays them, and creates no child again."""
    ca.CALLS.clear()
    with Runtime(store_url, tools=ca.registry(), lease_seconds=30) as rt:
        job = rt.submit(ca.parent, {"orders": ["WAIT-1", "A"]}).job_id
        rt.run_until_idle()
        assert rt.store.get_job(job).status == "waiting"
        children = {c.job_id for c in rt.store.list_jobs(JobFilter(parent=job))}
    batched = ToolRegistry([ca.refund, ca.refund_agent, ca.parent_batched])
    with Runtime(store_url, tools=batched, lease_seconds=30) as rt:
        (waiting,) = rt.store.list_jobs(JobFilter(parent=job, status=["waiting"]))
        rt.signal(waiting.job_id, "go-WAIT-1", None)
        rt.run_until_idle()
        done = rt.store.get_job(job)
        assert done.status == "completed", done.error
        assert {c.job_id for c in rt.store.list_jobs(JobFilter(parent=job))} == children
        assert [r["output"] for r in done.output] == [{"refunded": "WAIT-1"}, {"refunded": "A"}]
        assert_log_sound(rt.store, job)
    assert ca.CALLS == {"WAIT-1": 1, "A": 1}


def test_a_batch_out_of_bounds_or_with_a_bad_input_is_refused_before_anything_is_recorded(
    rt: Runtime,
) -> None:
    job = rt.submit(ca.bad_batch, {"n": 1001})
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    empty, too_many, bad_input = done.output
    assert "1 to 1000 inputs" in empty and "1 to 1000 inputs" in too_many
    assert "does not fit" in bad_input
    events = assert_log_sound(rt.store, job.job_id)
    assert of_type(events, "step_called") == []
    assert rt.store.list_jobs(JobFilter(parent=job.job_id)) == []


def test_run_until_idle_runs_the_children_a_run_makes_runnable_on_every_loop(
    rt: Runtime,
) -> None:
    """Only the parent is runnable when the loops start: the others wait for its run (not
    end, as idle) and then run its children at once (each child's tool meets the others)."""
    ca.MEETING[:] = [threading.Barrier(3)]
    job = rt.submit(ca.meeting, {"n": 3})
    rt.run_until_idle(concurrency=3)
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output == ["completed"] * 3


def test_the_children_of_a_run_still_going_run_on_the_other_loops(rt: Runtime) -> None:
    """The parent's run goes on after it created its children (it meets them): the loops
    waiting for it to end are told the children are runnable, and run them meanwhile."""
    ca.MEETING[:] = [threading.Barrier(3)]
    rt.worker.poll_seconds = 60.0  # (a loop does not claim again on its own meanwhile)
    job = rt.submit(ca.meeting_parent, {"n": 2})
    rt.run_until_idle(concurrency=3)
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output == ["completed"] * 2
