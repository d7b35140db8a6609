"""The exporter maps every trace state through the one definition of those states
(affidavit.record.NODE_STATE_KINDS); a state it cannot map is refused by name, never
exported as a pack that misstates the job. Packs made by an exporter that mislabelled a
completed step are refused with a reason that says so."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime, ToolRegistry
from affidavit.packs import PackError, TraceStateError, export_pack, verify_pack
from affidavit.packs import _format as F
from affidavit.packs._export_steps import STATE_KIND_STEPS, node_step
from affidavit.record import (
    COMPLETED_STATES,
    NODE_STATE_KIND_NAMES,
    NODE_STATE_KINDS,
    NODE_STATES,
)
from tests.packs.helpers import assay_verify
from tests.packs.scenarios import Env, build

OUTPUT = {"answer": 42}


def _node(state: str, *, started: bool = True, **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": "n",
        "state": state,
        "outcome": "pure" if state in COMPLETED_STATES else None,
        "started_at": "2026-12-01T00:00:00Z" if started else None,
        "duration_ms": 3.4,
        **extra,
    }
    if state in COMPLETED_STATES:
        node["output"] = OUTPUT
    return node


def test_every_state_kind_has_a_step_mapping() -> None:
    assert set(NODE_STATE_KINDS) == set(NODE_STATES)
    assert set(NODE_STATE_KINDS.values()) <= set(NODE_STATE_KIND_NAMES)
    assert set(STATE_KIND_STEPS) == set(NODE_STATE_KIND_NAMES)
    # the states a person's answer leaves are completed ones (the finding: they were not)
    assert {"approved", "signalled"} <= COMPLETED_STATES


@pytest.mark.parametrize("state", NODE_STATES)
def test_every_trace_state_maps_to_a_step_status(state: str) -> None:
    status, trace, duration = node_step(_node(state), "failed")
    if NODE_STATE_KINDS[state] == "completed":
        assert (status, trace, duration) == ("PASS", OUTPUT, 3)
    else:  # failed, or ended by the job while open: what its last try recorded
        assert (status, trace) == ("FAIL", {"outcome": None, "error": None})
    if state != "failed":  # never started: it did not run
        assert node_step(_node(state, started=False), "cancelled")[:2] == (
            ("PASS", OUTPUT)
            if NODE_STATE_KINDS[state] == "completed"
            else ("FAIL", {"outcome": "not_run", "job_status": "cancelled"})
        )


def test_a_state_the_exporter_does_not_know_is_refused_by_name() -> None:
    with pytest.raises(TraceStateError) as caught:
        node_step(_node("teleported"), "completed")
    assert "'teleported'" in caught.value.message
    assert isinstance(caught.value, PackError) and caught.value.hint


def test_a_completed_state_without_its_output_is_refused() -> None:
    node = _node("approved")
    del node["output"]
    with pytest.raises(TraceStateError, match="approved without an output"):
        node_step(node, "completed")


def _step_receipts(pack: Path) -> dict[str, dict[str, Any]]:
    receipts = [json.loads(line) for line in (pack / F.RECEIPTS).read_text().splitlines()]
    return {r["step_id"]: r for r in receipts if r["type"] == F.STEP}


@pytest.mark.parametrize("state", ["approved", "signalled"])
def test_a_pack_that_records_an_answered_step_as_failed_is_refused_precisely(
    store_url: str,
    tmp_path: Path,
    make_runtime: Callable[[ToolRegistry], Runtime],
    monkeypatch: pytest.MonkeyPatch,
    state: str,
) -> None:
    """What the exporter wrote before it knew these states: the answered node as a FAIL step
    with trace ``{"outcome": "pure", "error": null}``. The receipts agree with themselves, so
    only the event log can tell; the verifier says what is wrong, not just "differs"."""
    job_id = build(Env(store_url, tmp_path, make_runtime), state, "plan")
    store = make_runtime(ToolRegistry([])).store
    with monkeypatch.context() as old_exporter:
        old_exporter.setitem(NODE_STATE_KINDS, state, "failed")
        pack = export_pack(store, job_id, tmp_path / "pack").pack_dir
    steps = _step_receipts(pack)
    # the answered node FAIL, what depends on it (the job's output too) SKIPPED
    [answered] = [sid for sid, r in steps.items() if r["step_status"] == "FAIL"]
    assert steps[F.EMIT_STEP_ID]["step_status"] == "SKIPPED"
    assert json.loads((pack / F.TRACES_DIR / f"{answered}.json").read_text()) == {
        "outcome": "pure",
        "error": None,
    }
    result = verify_pack(pack)
    assert result.verdict == "INTEGRITY_FAIL"
    reason = next(e for e in result.errors if f"{answered}.json" in e)
    assert "records a step that completed (pure) as failed" in reason
    assert "export the job again" in reason
    # exported again, as it is now: MATCH
    again = export_pack(store, job_id, tmp_path / "again").pack_dir
    assert verify_pack(again).verdict == "MATCH"


@pytest.mark.parametrize("job_kind", ["plan", "agent"])
def test_a_compensated_step_is_a_fail_and_an_old_pack_showing_it_passed_is_refused(
    store_url: str,
    tmp_path: Path,
    make_runtime: Callable[[ToolRegistry], Runtime],
    monkeypatch: pytest.MonkeyPatch,
    job_kind: str,
) -> None:
    """A compensated step — its call failed, its compensation ran — is FAIL with the outcome
    `compensated`. The exporter used to show it PASS with its (null) output; such a pack is
    refused with that reason."""
    job_id = build(Env(store_url, tmp_path, make_runtime), "compensated", job_kind)
    store = make_runtime(ToolRegistry([])).store
    pack = export_pack(store, job_id, tmp_path / "pack").pack_dir
    steps = _step_receipts(pack)
    [compensated] = [
        sid for sid, r in steps.items() if r["step_status"] == "FAIL" and sid != F.EMIT_STEP_ID
    ]
    assert json.loads((pack / F.TRACES_DIR / f"{compensated}.json").read_text()) == {
        "outcome": "compensated",
        "error": None,
    }
    assert verify_pack(pack).verdict == "MATCH"
    with monkeypatch.context() as old_exporter:
        old_exporter.setitem(NODE_STATE_KINDS, "compensated", "completed")
        old = export_pack(store, job_id, tmp_path / "old").pack_dir
    assert _step_receipts(old)[compensated]["step_status"] == "PASS"
    result = verify_pack(old)
    assert result.verdict == "INTEGRITY_FAIL"
    reason = next(e for e in result.errors if f"{compensated}.json" in e)
    assert "records a compensated step as passed" in reason
    assert any(f"[{compensated}]: step_status PASS but" in e for e in result.errors)


def _lying(status: str, trace: Callable[[dict[str, Any]], Any]) -> Any:
    return lambda node, job_status: (status, trace(node), 0)


LIES = {
    # a completed step shown as failed, with its true output (its dependents then SKIPPED)
    "completed_as_failed": ("completed", _lying("FAIL", lambda n: n["output"])),
    # a failed step shown as passed, with its true failure as the trace
    "failed_as_passed": (
        "failed",
        _lying("PASS", lambda n: {"outcome": n.get("outcome"), "error": n.get("error")}),
    ),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_signed_pack_whose_step_status_misstates_the_log_is_refused(
    store_url: str,
    tmp_path: Path,
    make_runtime: Callable[[ToolRegistry], Runtime],
    monkeypatch: pytest.MonkeyPatch,
    lie: str,
) -> None:
    """Whoever holds the key can write a pack whose every receipt, hash and signature agree
    and whose traces are what the log recorded, but whose step statuses are not the job's:
    the statuses are bound to the log too."""
    kind, mapping = LIES[lie]
    job_id = build(Env(store_url, tmp_path, make_runtime), "rejected", "plan")
    store = make_runtime(ToolRegistry([])).store
    with monkeypatch.context() as liar:
        liar.setitem(STATE_KIND_STEPS, kind, mapping)
        pack = export_pack(store, job_id, tmp_path / "pack").pack_dir
    code, receipt, _ = assay_verify(pack, tmp_path / "assay-out")
    assert (code, receipt.get("verdict")) == (0, "MATCH")  # consistent in itself
    result = verify_pack(pack)
    assert result.verdict == "INTEGRITY_FAIL", result.errors
    expected = "but the event log has the step " + ("pass" if kind == "completed" else "not pass")
    assert any(expected in e for e in result.errors), result.errors


def test_every_state_the_traces_assign_is_a_known_state() -> None:
    """A state the plan or agent trace starts assigning without adding it to NODE_STATE_KINDS
    would make every export of such a job refuse (TraceStateError): caught here instead. The
    states are the strings assigned to ``state`` in the state ladder both traces use (and in
    the two trace modules), the answered-wait states, and the completed result types a node's
    state is copied from."""
    import ast
    import inspect

    from affidavit.core.events import COMPLETED_RESULT_TYPES
    from affidavit.record import _agent_trace, _states, _trace

    assigned: set[str] = set()
    for module in (_states, _trace, _agent_trace):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if not isinstance(node, ast.Assign):
                continue
            if "state" in {t.id for t in node.targets if isinstance(t, ast.Name)}:
                values = [node.value]
                if isinstance(node.value, ast.IfExp):  # state = "a" if ... else "b"
                    values = [node.value.body, node.value.orelse]
                for value in values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        assigned.add(value.value)
    assert {"parked", "in_flight", "waiting", "failed", "skipped", "running", "denied"} <= assigned
    answered = set(_states.ANSWERED_STATES.values())
    assert assigned | answered | COMPLETED_RESULT_TYPES <= set(NODE_STATES)
