"""Agent jobs as proof packs: one step per recorded call, in sequence order; MATCH from our
verifier and from assay's; a trace rewritten after export is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affidavit.core.canonical import canonical
from affidavit.packs import _format as F
from affidavit.packs import export_pack, verify_pack
from affidavit.store import Store
from tests.packs.helpers import assay_verify
from tests.verify.agent_log import AgentLog, refund_agent_log, store_log


def _caught_failure_log() -> AgentLog:
    """A tool fails for good, the agent catches it and goes on; then the job completes."""
    log = AgentLog().start()
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 5})
    node_id, step_id = log.called("tool", "issue_refund", {"amount": 5})
    log.add("node_started", node_id=node_id, step_id=step_id, attempt=1, worker_id="w1")
    log.add(
        "node_finished",
        node_id=node_id,
        step_id=step_id,
        result_type="permanent_failure",
        error={"type": "ValueError", "message": "card declined"},
        attempt=1,
        duration_ms=1,
    )
    log.tool("send_email", {"template": "sorry"}, {"sent": True})
    log.complete({"refunded": 0})
    return log


def _failed_log() -> AgentLog:
    log = AgentLog().start()
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 5})
    log.recorded("uuid", "5b1e")
    log.add("job_failed", error={"type": "RuntimeError", "message": "agent raised"})
    return log


def _unpinned_log() -> AgentLog:
    """An agent not pinned (``agent_version`` null), continued by edited code: each step
    records the hash of the source that called it."""
    log = AgentLog(version=None).start()
    log.events[1][1]["code_sha256"] = "a" * 64
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 5})
    log.recorded("now", 1.5)
    for n, (event_type, payload) in enumerate(log.events):
        if event_type == "step_called":
            payload["code_sha256"] = "a" * 64 if n < 5 else "b" * 64
    log.complete({"refunded": 0})
    return log


LOGS = {
    "refund": refund_agent_log,
    "caught_failure": _caught_failure_log,
    "failed": _failed_log,
    "unpinned": _unpinned_log,
}


@pytest.mark.parametrize("name", sorted(LOGS))
def test_agent_pack_matches_ours_and_assays(store: Store, tmp_path: Path, name: str) -> None:
    log = LOGS[name]()
    job_id = store_log(store, log)
    result = export_pack(store, job_id, tmp_path / "pack")
    ours = verify_pack(result.pack_dir)
    assert (ours.verdict, ours.exit_code) == ("MATCH", 0), ours.errors
    assert ours.details["affidavit"]["present"]
    code, receipt, details = assay_verify(result.pack_dir, tmp_path / "assay-out")
    assert (code, receipt.get("verdict")) == (0, "MATCH"), details
    assert receipt["original_pack_root_sha256"] == "sha256:" + result.pack_root_sha256


def test_one_step_per_call_in_sequence_order(store: Store, tmp_path: Path) -> None:
    log = refund_agent_log()
    job_id = store_log(store, log)
    pack = export_pack(store, job_id, tmp_path / "pack").pack_dir
    calls = [p for t, p in log.events if t == "step_called"]
    expected = [F.agent_pack_step_id(p["seq"], p["step_id"], len(calls)) for p in calls]
    assert expected[0] == f"000000-{calls[0]['step_id']}"
    contract = json.loads((pack / F.CONTRACT).read_text())
    steps = contract["replay_script"]["steps"]
    assert [s["step_id"] for s in steps] == [F.LOAD_STEP_ID, *expected, F.EMIT_STEP_ID]
    transforms = [s["params"]["transform"] for s in steps[1:-1]]
    assert transforms == [f"{p['kind']}:{p['tool_name'] or ''}" for p in calls]
    receipts = [json.loads(line) for line in (pack / F.RECEIPTS).read_text().splitlines()]
    step_receipts = [r["step_id"] for r in receipts if r["type"] == F.STEP]
    assert step_receipts == [F.LOAD_STEP_ID, *expected, F.EMIT_STEP_ID]
    # the refund's recorded trace is its committed result; the approval's, the signal payload
    refund = (pack / F.TRACES_DIR / f"{expected[4]}.json").read_bytes()
    assert refund == canonical({"refund_id": "R-1"})
    approval = (pack / F.TRACES_DIR / f"{expected[2]}.json").read_bytes()
    assert approval == canonical({"approved": True, "by": "ops"})
    event_log = next(r for r in receipts if r["type"] == F.EVENT_LOG)
    assert event_log["plan_hash"] == log.events[1][1]["agent_hash"]


def test_caught_failure_is_a_fail_step_that_blocks_nothing(store: Store, tmp_path: Path) -> None:
    job_id = store_log(store, _caught_failure_log())
    pack = export_pack(store, job_id, tmp_path / "pack").pack_dir
    receipts = [json.loads(line) for line in (pack / F.RECEIPTS).read_text().splitlines()]
    statuses = [r["step_status"] for r in receipts if r["type"] == F.STEP]
    assert statuses == ["PASS", "PASS", "FAIL", "PASS", "PASS"]


def test_rewritten_agent_trace_is_caught(store: Store, tmp_path: Path) -> None:
    log = refund_agent_log()
    job_id = store_log(store, log)
    pack = export_pack(store, job_id, tmp_path / "pack").pack_dir
    calls = [p for t, p in log.events if t == "step_called"]
    refund = F.agent_pack_step_id(4, calls[4]["step_id"], len(calls))
    (pack / F.TRACES_DIR / f"{refund}.json").write_bytes(canonical({"refund_id": "R-2"}))
    result = verify_pack(pack)
    assert result.verdict != "MATCH"
    assert any(refund in error for error in result.errors), result.errors
