"""Every kind of finished job — approvals, signals, sleeps, parks and resumes, cancellations,
retries, recoveries after a killed worker, failures, compensations; plan and agent jobs; both
backends — exports a pack that ``affidavit pack verify`` and assay's ``rce-verify`` both find
a MATCH, and whose step statuses say what the job's trace says."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from affidavit import Runtime, ToolRegistry
from affidavit.packs import _format as F
from affidavit.packs import export_pack, verify_pack
from affidavit.record import NODE_STATE_KINDS, NODE_STATES, job_trace
from tests.cli.test_cli import cli
from tests.packs.helpers import assay_verify
from tests.packs.scenarios import CASES, SIGNS, Env, build


def _step_statuses(pack: Path) -> dict[str, str]:
    receipts = [json.loads(line) for line in (pack / F.RECEIPTS).read_text().splitlines()]
    return {r["step_id"]: r["step_status"] for r in receipts if r["type"] == F.STEP}


@pytest.mark.parametrize(("kind", "job_kind"), CASES, ids=[f"{k}-{j}" for k, j in CASES])
def test_every_kind_of_finished_job_exports_a_pack_that_matches(
    store_url: str,
    tmp_path: Path,
    make_runtime: Callable[[ToolRegistry], Runtime],
    kind: str,
    job_kind: str,
) -> None:
    env = Env(store_url, tmp_path, make_runtime)
    job_id = build(env, kind, job_kind)
    store = make_runtime(ToolRegistry([])).store
    events = store.list_events(job_id)
    assert all(sign(events) for sign in SIGNS[kind]), [sign(events) for sign in SIGNS[kind]]
    result = export_pack(store, job_id, tmp_path / "pack")
    ours = verify_pack(result.pack_dir)
    assert (ours.verdict, ours.exit_code) == ("MATCH", 0), ours.errors
    assert ours.details["affidavit"]["present"]
    code, receipt, details = assay_verify(result.pack_dir, tmp_path / "assay-out")
    assert (code, receipt.get("verdict")) == (0, "MATCH"), (receipt, details)
    assert receipt["original_pack_root_sha256"] == "sha256:" + result.pack_root_sha256

    # the pack says of each node what the trace says: PASS exactly when it completed
    trace = job_trace(store, job_id)
    assert trace.get("kind", "plan") == job_kind
    statuses = _step_statuses(result.pack_dir)
    nodes = trace["nodes"]
    for node in nodes:
        assert node["state"] in NODE_STATES
        sid = (
            F.agent_pack_step_id(node["seq"], node["step_id"], len(nodes))
            if job_kind == "agent"
            else node["step_id"]
        )
        completed = NODE_STATE_KINDS[node["state"]] == "completed"
        assert (statuses[sid] == "PASS") is completed, (node["id"], node["state"], statuses[sid])
    job = store.get_job(job_id)
    assert (statuses[F.EMIT_STEP_ID] == "PASS") is (job.status == "completed")


def test_an_approved_plan_job_exports_and_verifies_with_the_cli(
    store_url: str, tmp_path: Path, make_runtime: Callable[[ToolRegistry], Runtime]
) -> None:
    """The finding: `affidavit pack export JOB DIR` then `affidavit pack verify DIR` on an
    approved, completed plan job said INTEGRITY_FAIL (its approval step recorded as failed)."""
    job_id = build(Env(store_url, tmp_path, make_runtime), "approved", "plan")
    pack = tmp_path / "pack"
    exported = cli("pack", "export", job_id, str(pack), "--db", store_url, "--json")
    assert exported.returncode == 0, exported.stderr
    verified = cli("pack", "verify", str(pack), "--out-dir", str(tmp_path / "out"), "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["verdict"] == "MATCH"
    approval = job_trace(make_runtime(ToolRegistry([])).store, job_id)["nodes"][1]
    assert approval["state"] == "approved"
    assert _step_statuses(pack)[approval["step_id"]] == "PASS"
    recorded = json.loads((pack / F.TRACES_DIR / f"{approval['step_id']}.json").read_text())
    assert recorded == {"approved": True, "comment": "fine"}  # the answer
