"""Child jobs from the command line, as real subprocesses on both backends: a worker runs a
parent and its children; ``jobs show`` and ``jobs list --parent`` name them; ``verify --tree``
verifies the tree and fails when a child was rewritten."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import cli, json_of
from tests.verify.helpers import RawDb

CHILD_TOOLS = str(Path(__file__).resolve().parents[1] / "runtime" / "child_agents.py")


def test_a_tree_from_the_command_line(store_url: str) -> None:
    orders = json.dumps({"orders": ["A", "B"]})
    submitted = cli("submit", "--agent", "ch_parent", "--tools", CHILD_TOOLS,
                    "--input", orders, "--db", store_url, "--json")  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    root = json_of(submitted)["job_id"]
    w = cli("worker", "--tools", CHILD_TOOLS, "--until-idle", "--db", store_url, "--json")
    assert w.returncode == 0, w.stderr
    shown = json_of(cli("jobs", "show", root, "--db", store_url, "--json"))
    assert shown["status"] == "completed" and shown["parent_job_id"] is None
    children = shown["children"]
    assert len(children) == 2 and [r["job_id"] for r in shown["output"]] == children
    child = json_of(cli("jobs", "show", children[0], "--db", store_url, "--json"))
    assert child["parent_job_id"] == root and child["children"] == []
    listed = json_of(cli("jobs", "list", "--parent", root, "--db", store_url, "--json"))
    assert sorted(j["job_id"] for j in listed) == sorted(children)
    tree = cli("verify", root, "--tree", "--db", store_url, "--json")
    assert tree.returncode == 0, tree.stdout
    doc = json_of(tree)
    assert doc["ok"] is True and [j["job_id"] for j in doc["jobs"]] == [root, *children]
    assert cli("verify", root, "--tree", "--db", store_url).returncode == 0
    raw = RawDb(store_url)
    version, _, _, payload, _ = raw.events(children[1])[-1]
    raw.set_payload(children[1], version, payload.replace(b'"B"', b'"Z"'))
    bad = cli("verify", root, "--tree", "--db", store_url, "--json")
    assert bad.returncode == 1
    assert [j["ok"] for j in json_of(bad)["jobs"]] == [True, True, False]
    assert cli("verify", "--tree", "--db", store_url).returncode == 3
