"""``verify --tree`` on both backends: a parent and its child jobs verify as one tree; a child
rewritten and re-sealed with the operator's key, or a child's row rewritten, fails its parent's
tree (the parent's child_completed holds the child's chain head and seal hash)."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from affidavit import Runtime
from affidavit.verify import verify_job, verify_tree
from affidavit.verify.repair import seal_unsealed
from tests.runtime import child_agents as ca
from tests.verify.helpers import RawDb


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    ca.CALLS.clear()
    with Runtime(store_url, tools=ca.registry(), lease_seconds=30) as runtime:
        yield runtime


def _tree(rt: Runtime) -> tuple[str, list[str]]:
    job = rt.submit(ca.parent, {"orders": ["A", "B"]})
    rt.run_until_idle()
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    return job.job_id, [r["job_id"] for r in done.output]


def test_a_tree_verifies(rt: Runtime) -> None:
    root, children = _tree(rt)
    tree = verify_tree(rt.store, root)
    assert tree.ok, tree.to_dict()
    assert [r.job_id for r in tree.results] == [root, *children]
    assert [(link.parent_job_id, link.child_job_id) for link in tree.links] == [
        (root, c) for c in children
    ]
    doc = tree.to_dict()
    assert doc["ok"] is True and len(doc["jobs"]) == 3


def test_a_child_rewritten_and_resealed_fails_its_parents_tree(rt: Runtime, store_url: str) -> None:
    root, children = _tree(rt)
    raw = RawDb(store_url)
    forged = children[0]
    events = raw.events(forged)
    rows = []
    for _, event_id, event_type, payload, _ in events:
        if event_type == "job_completed":
            doc = orjson.loads(payload)
            doc["output"] = {"refunded": "nothing"}
            payload = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
        rows.append((event_id, event_type, payload))
    raw.rewrite_log(forged, rows)
    raw.execute("UPDATE jobs SET output = ? WHERE job_id = ?", ('{"refunded":"nothing"}', forged))
    raw.execute("DELETE FROM seals WHERE job_id = ?", (forged,))
    assert [s.job_id for s in seal_unsealed(rt.store, rt.sealer).sealed] == [forged]
    assert verify_job(rt.store, forged).ok  # on its own, the forged child holds together
    tree = verify_tree(rt.store, root)
    assert not tree.ok
    (bad,) = [link for link in tree.links if link.problem]
    assert bad.child_job_id == forged and "chain_head" in bad.problem
    assert verify_tree(rt.store, children[1]).ok


def test_a_child_row_rewritten_fails_the_tree(rt: Runtime, store_url: str) -> None:
    root, children = _tree(rt)
    raw = RawDb(store_url)
    (version, _, _, payload, _) = raw.events(children[1])[-1]
    raw.set_payload(children[1], version, payload.replace(b'"B"', b'"Z"'))
    tree = verify_tree(rt.store, root)
    assert not tree.ok
    assert [r.ok for r in tree.results] == [True, True, False]


@pytest.mark.parametrize("edit", ["drop_a_child", "name_a_child_twice", "move_before_the_wait"])
def test_a_parents_links_rewritten_and_rechained_fail_its_replay_proof(
    rt: Runtime, store_url: str, edit: str
) -> None:
    root, _ = _tree(rt)
    raw = RawDb(store_url)
    rows = [(event_id, t, payload) for _, event_id, t, payload, _ in raw.events(root)]
    linked = [i for i, (_, t, _) in enumerate(rows) if t == "child_completed"]
    if edit == "drop_a_child":
        del rows[linked[0]]
    elif edit == "name_a_child_twice":
        rows[linked[1]] = (rows[linked[1]][0], "child_completed", rows[linked[0]][2])
    else:
        waiting = next(i for i, (_, t, _) in enumerate(rows) if t == "job_waiting")
        rows.insert(waiting, rows.pop(linked[0]))
    raw.rewrite_log(root, rows)
    result = verify_job(rt.store, root)
    assert not result.ok
    assert result.replay_proof_result.invariant == "closing_rule", result.to_dict()
    assert not verify_tree(rt.store, root).ok


def test_a_child_result_forged_on_its_row_before_the_join_does_not_reach_the_parent(
    rt: Runtime, store_url: str
) -> None:
    """An operator edits a finished child's row before its parent joins it, then puts the row
    back: the parent records the result the child's own log holds."""
    from affidavit.store import JobFilter

    job = rt.submit(ca.parent, {"orders": ["A", "B"]})
    assert rt.run_job(job.job_id).status == "waiting"
    children = [j.job_id for j in rt.store.list_jobs(JobFilter(parent=job.job_id))]
    for child in children:
        assert rt.run_job(child).status == "completed"
    raw = RawDb(store_url)
    ((kept,),) = raw.rows("SELECT output FROM jobs WHERE job_id = ?", (children[0],))
    raw.execute("UPDATE jobs SET output = ? WHERE job_id = ?", ('{"refunded":"all"}', children[0]))
    assert rt.run_job(job.job_id).status == "completed"
    raw.execute("UPDATE jobs SET output = ? WHERE job_id = ?", (kept, children[0]))
    # the join read the child's result from its log, not from the edited row
    (linked,) = [
        e.payload
        for e in rt.store.list_events(job.job_id)
        if e.type == "child_completed" and e.payload["job_id"] == children[0]
    ]
    assert linked["output"] == orjson.loads(kept) != {"refunded": "all"}
    assert verify_tree(rt.store, job.job_id).ok


def test_a_parent_that_recorded_another_result_fails_the_tree(rt: Runtime, store_url: str) -> None:
    """A parent's log rewritten to hold a result its child never produced (chain recomputed,
    re-sealed with the operator's key): each job verifies alone, the tree does not."""
    root, children = _tree(rt)
    raw = RawDb(store_url)
    rows = []
    for _, event_id, event_type, payload, _ in raw.events(root):
        doc = orjson.loads(payload)
        if event_type == "child_completed" and doc["job_id"] == children[0]:
            doc["output"] = {"refunded": "all"}
            payload = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
        rows.append((event_id, event_type, payload))
    raw.rewrite_log(root, rows)
    raw.execute("DELETE FROM seals WHERE job_id = ?", (root,))
    assert [s.job_id for s in seal_unsealed(rt.store, rt.sealer).sealed] == [root]
    assert verify_job(rt.store, root).ok
    tree = verify_tree(rt.store, root)
    assert not tree.ok
    (bad,) = [link for link in tree.links if link.problem]
    assert bad.child_job_id == children[0] and "output" in bad.problem, bad.problem
