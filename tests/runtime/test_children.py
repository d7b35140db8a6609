"""Child jobs (``ctx.start_job`` / ``ctx.join``), on both backends: each child is created once,
the parent waits without a worker and is woken by the child's end, a child's failure is data,
and the parent's log records each child's end."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from affidavit import Runtime
from affidavit.core.errors import SignalRejected
from affidavit.store import JobFilter
from tests.runtime import child_agents as ca
from tests.runtime.helpers import assert_log_sound, of_type


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    ca.CALLS.clear()
    with Runtime(store_url, tools=ca.registry(), lease_seconds=30) as runtime:
        yield runtime


def test_fan_out_and_join(rt: Runtime) -> None:
    job = rt.submit(ca.parent, {"orders": ["A", "BAD-1", "C"]})
    rt.run_until_idle()
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    statuses = [(r["status"], r["output"]) for r in done.output]
    assert statuses[0] == ("completed", {"refunded": "A"})
    assert statuses[1][0] == "failed" and done.output[1]["error"]["type"] == "agent_error"
    assert statuses[2] == ("completed", {"refunded": "C"})
    assert ca.CALLS == {"A": 1, "C": 1}
    events = assert_log_sound(rt.store, job.job_id)
    linked = of_type(events, "child_completed")
    children = [r["job_id"] for r in done.output]
    assert [c["job_id"] for c in linked] == children
    for c in linked:
        child = rt.store.get_job(c["job_id"])
        assert (c["chain_head"], c["event_count"]) == (child.head_hash, child.version)
        assert c["seal_sha256"] is not None
        created = rt.store.list_events(c["job_id"], limit=1)[0].payload
        assert created["parent_job_id"] == job.job_id
    listed = rt.store.list_jobs(JobFilter(parent=job.job_id))
    assert sorted(j.job_id for j in listed) == sorted(children)
    assert rt.store.job_parent(children[0]) == job.job_id
    assert rt.store.job_parent(job.job_id) is None


def test_parent_waits_without_a_worker_and_the_child_wakes_it(rt: Runtime) -> None:
    job = rt.submit(ca.one, {"order_id": "WAIT-1"})
    rt.run_until_idle()
    assert rt.store.get_job(job.job_id).status == "waiting"
    (child_id,) = [j.job_id for j in rt.store.list_jobs(JobFilter(parent=job.job_id))]
    assert rt.store.get_job(child_id).status == "waiting"
    with pytest.raises(SignalRejected):
        rt.signal(job.job_id, f"{job.job_id}:#1:children", {"forged": True})
    rt.signal(child_id, "go-WAIT-1", None)
    rt.run_until_idle()
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output == {"status": "completed", "output": {"refunded": "WAIT-1"}}
    assert ca.CALLS == {"WAIT-1": 1}
    assert_log_sound(rt.store, job.job_id)
    # created once: the same step's key names the same child
    assert len(rt.store.list_jobs(JobFilter(parent=job.job_id))) == 1


def test_cancelling_the_parent_cancels_its_children(rt: Runtime) -> None:
    job = rt.submit(ca.parent, {"orders": ["WAIT-2", "WAIT-3"]})
    rt.run_until_idle()
    children = [j.job_id for j in rt.store.list_jobs(JobFilter(parent=job.job_id))]
    assert len(children) == 2
    assert {rt.store.get_job(c).status for c in children} == {"waiting"}
    rt.cancel(job.job_id, reason="not needed")
    assert rt.store.get_job(job.job_id).status == "cancelled"
    assert {rt.store.get_job(c).status for c in children} == {"cancelled"}
    rt.run_until_idle()
    assert ca.CALLS == {}
    assert_log_sound(rt.store, job.job_id)


def test_a_cancelled_child_is_its_parents_result(rt: Runtime) -> None:
    job = rt.submit(ca.one, {"order_id": "WAIT-4"})
    rt.run_until_idle()
    (child,) = [j.job_id for j in rt.store.list_jobs(JobFilter(parent=job.job_id))]
    rt.cancel(child)
    rt.run_until_idle()
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output == {"status": "cancelled", "output": None}
    assert ca.CALLS == {}


def test_an_async_parent_awaits_its_children(rt: Runtime) -> None:
    job = rt.submit(ca.async_parent, {"orders": ["A", "WAIT-5", "C"]})
    rt.run_until_idle()
    assert rt.store.get_job(job.job_id).status == "waiting"
    (waiting,) = [
        j.job_id for j in rt.store.list_jobs(JobFilter(parent=job.job_id, status=["waiting"]))
    ]
    rt.signal(waiting, "go-WAIT-5", None)
    rt.run_until_idle()
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert [r["output"] for r in done.output] == [
        {"refunded": "A"},
        {"refunded": "WAIT-5"},
        {"refunded": "C"},
    ]
    assert ca.CALLS == {"A": 1, "WAIT-5": 1, "C": 1}
    assert_log_sound(rt.store, job.job_id)


def test_bad_child_calls_fail_clearly_and_change_nothing(rt: Runtime) -> None:
    job = rt.submit(ca.bad_join, {})
    done = rt.run_job(job.job_id)
    assert done.status == "failed"
    assert "ctx.start_job" in done.error["message"]
    assert rt.store.list_jobs(JobFilter(parent=job.job_id)) == []


def test_a_child_that_cannot_be_created_is_refused_before_anything_is_recorded(
    rt: Runtime,
) -> None:
    job = rt.submit(ca.bad_start, {})
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    assert len(done.output) == 3
    assert "not registered" in done.output[0] and "does not fit" in done.output[1]
    assert "no-such-queue" in done.output[2]
    events = assert_log_sound(rt.store, job.job_id)
    assert of_type(events, "step_called") == []
    assert rt.store.list_jobs(JobFilter(parent=job.job_id)) == []


def test_the_last_child_to_end_wakes_its_parent_and_no_earlier_one(rt: Runtime) -> None:
    """Each wake-up is a claim and a replay of the parent's log: only the end of the last
    awaited child wakes it — also when the last two end at once (on PostgreSQL the second
    waits on the parent's row until the first commits, then sees it ended)."""
    job = rt.submit(ca.parent, {"orders": ["WAIT-1", "WAIT-2", "WAIT-3"]})
    rt.run_until_idle()
    assert rt.store.get_job(job.job_id).status == "waiting"
    first, second, third = (
        c.job_id
        for c in sorted(
            rt.store.list_jobs(JobFilter(parent=job.job_id)),
            key=lambda c: rt.store.list_events(c.job_id, limit=1)[0].payload["input"]["order_id"],
        )
    )
    with rt.store.transaction() as tx:  # the first ends: two still run, the parent sleeps on
        tx.update_job(first, status="cancelled")
    assert rt.store.get_job(job.job_id).status == "waiting"
    ended_one = threading.Event()

    def end_second() -> None:
        with rt.store.transaction() as tx:
            tx.update_job(second, status="cancelled")
            tx.query("SELECT 1")  # (its writes sent now, not with the commit)
            ended_one.set()
            time.sleep(0.3)  # the third ends meanwhile, before this commits

    ending = threading.Thread(target=end_second)
    ending.start()
    assert ended_one.wait(10)
    with rt.store.transaction() as tx:
        tx.update_job(third, status="cancelled")
    ending.join()
    assert rt.store.get_job(job.job_id).status == "pending"  # woken, once
    rt.run_until_idle()
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert [r["status"] for r in done.output] == ["cancelled"] * 3
    assert_log_sound(rt.store, job.job_id)
