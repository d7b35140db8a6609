"""``verify --tree`` of children their parent started and never joined, on both backends: the
parent's start step records the child's id and the chain hash of its creation events, so a
child rewritten from its start and re-sealed with the operator's key fails the tree, as does a
child that names a step its parent never started; a child re-sealed after its seal reached the
transparency log fails on its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from affidavit import Runtime
from affidavit.store import open_store
from affidavit.tlog import LogKey, Sequencer, default_log_key_path
from affidavit.verify import verify_job, verify_tree
from tests.runtime import child_agents as ca
from tests.tlog.helpers import drop_guards
from tests.verify.helpers import RawDb


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    ca.CALLS.clear()
    with Runtime(store_url, tools=ca.registry(), lease_seconds=30) as runtime:
        yield runtime


def _unjoined(rt: Runtime) -> tuple[str, list[str]]:
    job = rt.submit(ca.forget, {"orders": ["A", "B"]})
    rt.run_until_idle()
    done = rt.store.get_job(job.job_id)
    assert done.status == "completed", done.error
    assert all(rt.store.get_job(c).status == "completed" for c in done.output)
    return job.job_id, list(done.output)


def _forge(rt: Runtime, url: str, job_id: str, edit: Callable[[str, dict[str, Any]], None]) -> None:
    """Rewrite the job's log with ``edit(type, payload)``, re-chain it and re-seal it with
    the store's own key (what an operator holding the key and the database can do)."""
    raw = RawDb(url)
    rows = []
    for _, event_id, event_type, payload, _ in raw.events(job_id):
        doc = orjson.loads(payload)
        edit(event_type, doc)
        rows.append((event_id, event_type, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)))
    raw.rewrite_log(job_id, rows)
    raw.execute("DELETE FROM seals WHERE job_id = ?", (job_id,))
    assert rt.sealer.seal_job(rt.store, job_id) is not None


def test_unjoined_children_verify_with_their_links(rt: Runtime) -> None:
    root, children = _unjoined(rt)
    tree = verify_tree(rt.store, root)
    assert tree.ok, tree.to_dict()
    assert [r.job_id for r in tree.results] == [root, *children]
    assert [(link.child_job_id, link.problem) for link in tree.links] == [(c, "") for c in children]
    started = [
        e.payload["output"]
        for e in rt.store.list_events(root)
        if e.type == "node_finished" and "job_id" in (e.payload.get("output") or {})
    ]
    assert [s["job_id"] for s in started] == children
    assert all(s["created_event_count"] == 2 and s["created_chain_head"] for s in started)


def test_an_unjoined_child_rewritten_from_its_start_fails_the_tree(
    rt: Runtime, store_url: str
) -> None:
    root, children = _unjoined(rt)

    def other_input(event_type: str, doc: dict[str, Any]) -> None:
        if event_type == "job_created":
            doc["input"] = {"order_id": "Z"}

    _forge(rt, store_url, children[0], other_input)
    assert verify_job(rt.store, children[0]).seal.ok  # the forged child is sealed anew
    tree = verify_tree(rt.store, root)
    assert not tree.ok
    (bad,) = [link for link in tree.links if link.problem]
    assert bad.child_job_id == children[0] and "creation events differ" in bad.problem
    assert verify_tree(rt.store, children[1]).ok


def test_an_unjoined_child_naming_a_step_its_parent_never_started_fails(
    rt: Runtime, store_url: str
) -> None:
    root, children = _unjoined(rt)

    def other_step(event_type: str, doc: dict[str, Any]) -> None:
        if event_type == "job_created":
            doc["parent_step_id"] = "0" * 16

    _forge(rt, store_url, children[1], other_step)
    tree = verify_tree(rt.store, root)
    assert not tree.ok
    (bad,) = [link for link in tree.links if link.problem]
    assert bad.child_job_id == children[1] and "no job step" in bad.problem


def test_an_unjoined_child_resealed_after_it_was_logged_fails(rt: Runtime, store_url: str) -> None:
    root, children = _unjoined(rt)
    store = open_store(store_url)
    try:
        Sequencer(store, LogKey(default_log_key_path(store_url))).integrate()
    finally:
        store.close()
    drop_guards(store_url)

    def other_output(event_type: str, doc: dict[str, Any]) -> None:
        if event_type == "job_completed":
            doc["output"] = {"refunded": "nothing"}

    _forge(rt, store_url, children[0], other_output)  # its start untouched: only its end
    RawDb(store_url).execute(
        "UPDATE jobs SET output = ? WHERE job_id = ?", ('{"refunded":"nothing"}', children[0])
    )
    tree = verify_tree(rt.store, root)
    assert not tree.ok
    assert [r.ok for r in tree.results] == [True, False, True]
    assert not any(link.problem for link in tree.links)  # the start is the one recorded
