"""What a parent's end does to its children that are still running, on both backends: a
parent that fails cancels them (by the cooperative cancel rules: a waiting or pending child
ends cancelled at once, its record sealed); a parked parent leaves them running (a person
decides the park), and failing it then (``resume --decision fail``) cancels them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from affidavit import Runtime
from affidavit.store import JobFilter
from affidavit.verify import verify_tree
from tests.runtime import child_agents as ca


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    ca.CALLS.clear()
    with Runtime(store_url, tools=ca.registry(), lease_seconds=30) as runtime:
        yield runtime


def _started(rt: Runtime, order: str) -> tuple[str, str]:
    """A parent waiting for its ``then`` signal, with one child waiting for its ``go``."""
    root = rt.submit(ca.parent_then, {"order_id": order}).job_id
    rt.run_until_idle()
    [child] = rt.store.list_jobs(JobFilter(parent=root))
    assert rt.get_job(root).status == "waiting"
    assert rt.get_job(child.job_id).status == "waiting"
    return root, child.job_id


def test_a_failed_parent_cancels_its_running_children(rt: Runtime) -> None:
    root, child = _started(rt, "WAIT-1")
    rt.signal(root, "then", "fail")
    rt.run_until_idle()
    assert rt.get_job(root).status == "failed"
    ended = rt.get_job(child)
    assert ended.status == "cancelled"
    cancelled = [e.payload for e in rt.store.list_events(child) if e.type == "job_cancelled"]
    assert cancelled and f"parent job {root} failed" in str(cancelled[0])
    assert ca.CALLS == {}  # the child never refunded
    tree = verify_tree(rt.store, root)
    assert tree.ok, tree.to_dict()
    assert [r.job_id for r in tree.results] == [root, child]


def test_a_parked_parent_leaves_its_children_running_until_it_is_failed(rt: Runtime) -> None:
    root, child = _started(rt, "WAIT-2")
    rt.signal(root, "then", "park")
    rt.run_until_idle()
    assert rt.get_job(root).status == "parked"
    assert rt.get_job(child).status == "waiting"  # left running: a person decides the park
    rt.resume(root, "fail", by="ops")
    assert rt.get_job(root).status == "failed"
    assert rt.get_job(child).status == "cancelled"
    assert ca.CALLS == {}
    tree = verify_tree(rt.store, root)
    assert tree.ok, tree.to_dict()


def test_a_parked_parents_child_runs_on(rt: Runtime) -> None:
    root, child = _started(rt, "WAIT-3")
    rt.signal(root, "then", "park")
    rt.run_until_idle()
    assert rt.get_job(root).status == "parked"
    rt.signal(child, "go-WAIT-3", {})
    rt.run_until_idle()
    assert rt.get_job(child).status == "completed"
    assert ca.CALLS == {"WAIT-3": 1}
    assert rt.get_job(root).status == "parked"  # still the person's to decide
