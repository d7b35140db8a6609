"""Proof packs of a job tree on both backends: ``pack export JOB DIR --tree`` writes every job's
pack (each MATCH in ours and in assay's ``rce-verify``) and ``tree.json``; ``pack verify DIR
--tree`` checks each pack and that each child's pack is the job its parent recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson

from affidavit import Runtime
from affidavit.packs import verify_tree_packs
from tests.cli.test_cli import cli, json_of
from tests.packs.helpers import assay_verify
from tests.runtime import child_agents as ca

CHILD_TOOLS = str(Path(__file__).resolve().parents[1] / "runtime" / "child_agents.py")


def _exported(store_url: str, tmp_path: Path) -> tuple[str, Path]:
    with Runtime(store_url, tools=ca.registry()) as rt:
        root = rt.submit(ca.parent, {"orders": ["A", "BAD-1"]}).job_id
        rt.run_until_idle()
        assert rt.get_job(root).status == "completed"
    out = tmp_path / "tree"
    made = cli("pack", "export", root, str(out), "--tree", "--db", store_url, "--json")
    assert made.returncode == 0, made.stderr
    assert json_of(made)["jobs"][0]["job_id"] == root
    return root, out


def test_a_tree_of_packs_verifies_here_and_in_assay(store_url: str, tmp_path: Path) -> None:
    root, out = _exported(store_url, tmp_path)
    tree = json.loads((out / "tree.json").read_text())
    jobs = [j["job_id"] for j in tree["jobs"]]
    assert len(jobs) == 3 and tree["root"] == root
    assert [j["parent_job_id"] for j in tree["jobs"]] == [None, root, root]
    for job_id in jobs:
        code, result, _ = assay_verify(out / job_id, tmp_path / "assay" / job_id)
        assert code == 0 and result.get("verdict") == "MATCH", result
    checked = cli("pack", "verify", str(out), "--tree", "--out-dir", str(tmp_path / "v"),
                  "--json")  # fmt: skip
    assert checked.returncode == 0, checked.stdout
    doc = json_of(checked)
    assert doc["ok"] is True and set(doc["packs"]) == set(jobs)
    assert (tmp_path / "v" / jobs[1] / "rce_replay_result.json").exists()


def test_a_child_pack_swapped_for_another_job_fails_the_tree(
    store_url: str, tmp_path: Path
) -> None:
    _, out = _exported(store_url, tmp_path)
    jobs = [j["job_id"] for j in json.loads((out / "tree.json").read_text())["jobs"]]
    # a pack that verifies on its own, of another job, put in the place of a child's
    with Runtime(store_url, tools=ca.registry()) as rt:
        other = rt.submit(ca.refund_agent, {"order_id": "A"}).job_id
        rt.run_until_idle()
    assert cli("pack", "export", other, str(tmp_path / "other"), "--db", store_url).returncode == 0
    shutil.rmtree(out / jobs[1])
    shutil.copytree(tmp_path / "other", out / jobs[1])
    verdict = verify_tree_packs(out)
    assert not verdict.ok
    assert verdict.packs[jobs[1]].ok  # on its own, the swapped pack holds together
    assert any(f"child {jobs[1]} is not the job its parent" in p for p in verdict.problems)
    bad = cli("pack", "verify", str(out), "--tree", "--out-dir", str(tmp_path / "v"), "--json")
    assert bad.returncode == 2


def test_a_malformed_tree_file_fails_closed(store_url: str, tmp_path: Path) -> None:
    _, out = _exported(store_url, tmp_path)
    doc = json.loads((out / "tree.json").read_text())
    for broken in (
        {**doc, "jobs": [{"job_id": "../../etc", "parent_job_id": None}]},
        {**doc, "jobs": doc["jobs"][1:]},
        {**doc, "format": "something/v9"},
    ):
        (out / "tree.json").write_bytes(orjson.dumps(broken))
        verdict = verify_tree_packs(out)
        assert not verdict.ok and verdict.problems[0].startswith("tree.json")


def test_a_parent_that_recorded_another_child_result_fails_the_tree(
    store_url: str, tmp_path: Path
) -> None:
    """A parent's log rewritten to hold a result its child never produced and re-sealed with the
    operator's key: each pack verifies on its own, the tree does not — the child's terminal
    event says otherwise."""
    from affidavit.verify.repair import seal_unsealed
    from tests.verify.helpers import RawDb

    raw = RawDb(store_url)
    with Runtime(store_url, tools=ca.registry()) as rt:
        root = rt.submit(ca.parent, {"orders": ["A", "B"]}).job_id
        rt.run_until_idle()
        rows, forged = [], None
        for _, event_id, event_type, payload, _ in raw.events(root):
            doc = orjson.loads(payload)
            if event_type == "child_completed" and forged is None:
                forged, doc["output"] = doc["job_id"], {"refunded": "all"}
                payload = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
            rows.append((event_id, event_type, payload))
        raw.rewrite_log(root, rows)
        raw.execute("DELETE FROM seals WHERE job_id = ?", (root,))
        assert [s.job_id for s in seal_unsealed(rt.store, rt.sealer).sealed] == [root]
    out = tmp_path / "tree"
    assert cli("pack", "export", root, str(out), "--tree", "--db", store_url).returncode == 0
    verdict = verify_tree_packs(out)
    assert all(p.ok for p in verdict.packs.values()) and not verdict.ok
    assert any("output" in p and str(forged) in p for p in verdict.problems), verdict.problems
