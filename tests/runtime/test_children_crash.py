"""Crash windows of child jobs, on both backends: a real worker process SIGKILLs itself while a
parent creates, waits for or links its children (crash_tools.crash_parent: two charge agents as
child jobs, joined), then another worker process finishes the tree. Every child is created
once, every charge happens once, the tree verifies."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.store import JobFilter
from affidavit.verify import verify_tree
from tests.runtime.crash_tools import REGISTRY, counts
from tests.runtime.helpers import assert_log_sound, run_driver

CRASH_LEASE = "0.5"


def assert_tree_once(rt: Runtime, side: Path, root: str, n: int = 2) -> None:
    """The parent completed with ``n`` children, each created once and charging once per
    call."""
    job = rt.get_job(root)
    assert job.status == "completed", job.error
    children = rt.store.list_jobs(JobFilter(parent=root))
    assert len(children) == n  # created once each, crash or not
    assert sorted(r["job_id"] for r in job.output["children"]) == sorted(c.job_id for c in children)
    assert all(r["status"] == "completed" for r in job.output["children"])
    charged = counts(side, "charge")
    assert sorted(charged.values()) == [1] * (2 * n)  # two charges per child, each once
    assert {j for j, _ in charged} == {c.job_id for c in children}
    assert_log_sound(rt.store, root)
    tree = verify_tree(rt.store, root)
    assert tree.ok, tree.to_dict()
    assert len(tree.results) == 1 + n


@pytest.mark.parametrize(
    "point",
    [
        "child.after_create",  # the child exists; the parent has not recorded it
        "child.after_create:2",  # the second child
        "wait.after_record",  # the parent waits for its children (no worker holds it)
        "tool.after_execute",  # a child killed mid-tool (its charge reconciled, not repeated)
        "child.before_link",  # the children ended; the parent has not recorded them
    ],
)
def test_a_tree_survives_a_kill(store_url: str, tmp_path: Path, point: str) -> None:
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        root = rt.submit("crash_parent", {"side": str(side)}).job_id
        killed = run_driver(store_url, "--lease", CRASH_LEASE, crash=point)
        assert killed.returncode == -9, killed
        finished = run_driver(store_url, "--until-done")
        assert finished.returncode == 0, finished.stderr
        assert_tree_once(rt, side, root)


@pytest.mark.parametrize(
    "point",
    [
        "child.before_create_commit",  # killed midway: the batch's inserts sent, not committed
        "child.after_create",  # the batch exists; the parent has not recorded it
        "wait.after_record",
        "child.before_link",
    ],
)
def test_a_batch_survives_a_kill(store_url: str, tmp_path: Path, point: str) -> None:
    """A parent killed while it creates its children as one batch (``ctx.start_jobs``) finds
    all of them, or none, on recovery: each created once."""
    side = tmp_path / "side.jsonl"
    with Runtime(store_url, tools=REGISTRY, lease_seconds=5) as rt:
        root = rt.submit("crash_batch_parent", {"side": str(side)}).job_id
        killed = run_driver(store_url, "--lease", CRASH_LEASE, crash=point)
        assert killed.returncode == -9, killed
        if point == "child.before_create_commit":
            assert rt.store.list_jobs(JobFilter(parent=root)) == []  # (rolled back)
        elif point == "child.after_create":
            assert len(rt.store.list_jobs(JobFilter(parent=root))) == 3
        finished = run_driver(store_url, "--until-done")
        assert finished.returncode == 0, finished.stderr
        assert_tree_once(rt, side, root, 3)
