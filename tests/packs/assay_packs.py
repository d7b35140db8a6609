"""Packs built with assay's own ``ProofPack`` API in the shapes of the RCE profile (its basic
fixture: s01 LOAD_INPUT → s02 APPLY_TRANSFORM "double" → s03 EMIT_OUTPUT), for checking that
``affidavit pack verify`` and ``assay rce-verify`` agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.packs import _format as F

RUN_ID = "run_rce_fixture"
EPISODE = "ep_" + "0123456789abcdef01234567"
TS = "2026-04-06T12:00:00+00:00"
INPUT = b'{"value":21}'

SCENARIOS = {
    # name: (assay's verdict, exit code)
    "valid": ("MATCH", 0),
    "skipped_after_failed_assertion": ("MATCH", 0),
    "dependent_pass_after_fail": ("INTEGRITY_FAIL", 2),
    "broken_input_hashes": ("INTEGRITY_FAIL", 2),
    "rewritten_traces": ("DIVERGE", 1),
    "changed_contract": ("INTEGRITY_FAIL", 2),
    "missing_trace": ("INTEGRITY_FAIL", 2),
    "wrong_outputs_hash": ("INTEGRITY_FAIL", 2),
}
# Malformations assay itself crashes on (a traceback, no verdict); we answer INTEGRITY_FAIL.
CRASHES = ("unknown_step_id", "contract_without_replay_script")


def _contract(assertion: bool) -> dict[str, Any]:
    environment: dict[str, Any] = {
        "provider": "openai",
        "model_id": "gpt-4o",
        "tool_versions": {"assay": "1.20.2"},
        "container_digest": None,
    }
    environment["env_fingerprint_hash"] = F.h(F.env_fingerprint_input(environment))
    middle: dict[str, Any] = (
        {
            "step_id": "s02",
            "opcode": "ASSERT_HASH",
            "params": {"target": "s01", "expected_hash": "sha256:" + "0" * 64},
            "depends_on": ["s01"],
        }
        if assertion
        else {
            "step_id": "s02",
            "opcode": "APPLY_TRANSFORM",
            "params": {"transform": "double"},
            "depends_on": ["s01"],
        }
    )
    return {
        "schema_version": "rce/0.1",
        "episode_id": EPISODE,
        "objective": "double a number",
        "inputs": [
            {"ref": "input.json", "hash": F.prefixed(INPUT), "media_type": "application/json"}
        ],
        "replay_script": {
            "schema_version": "replay_script/0.1",
            "steps": [
                {
                    "step_id": "s01",
                    "opcode": "LOAD_INPUT",
                    "params": {"ref": "input.json"},
                    "depends_on": [],
                },
                middle,
                {
                    "step_id": "s03",
                    "opcode": "EMIT_OUTPUT",
                    "params": {"claim_type": "demo", "output_ref": "s02"},
                    "depends_on": ["s02"],
                },
            ],
        },
        "replay_policy": {"replay_basis": "recorded_trace", "comparator_tier": "A"},
        "environment": environment,
    }


def build(root: Path, scenario: str) -> Path:
    """Build ``scenario`` into ``root/pack`` with assay's ProofPack and return the pack dir."""
    from assay.keystore import AssayKeyStore
    from assay.proof_pack import ProofPack

    assertion = scenario in ("skipped_after_failed_assertion", "dependent_pass_after_fail")
    contract = _contract(assertion)
    traces: dict[str, Any] = {
        "s01": {"value": 21},
        "s02": {"value": 42},
        "s03": {"claim_type": "demo", "value": 42},
    }
    status = {"s01": "PASS", "s02": "PASS", "s03": "PASS"}
    if assertion:
        traces["s02"] = {"assertion_passed": False}
        status["s02"] = "FAIL"
        status["s03"] = "SKIPPED" if scenario == "skipped_after_failed_assertion" else "PASS"
    hashes = {s: F.h(t) for s, t in traces.items()}
    steps = contract["replay_script"]["steps"]
    step_receipts: list[dict[str, Any]] = []
    for step in steps:
        sid = step["step_id"]
        skipped = status[sid] == "SKIPPED"
        payload: dict[str, Any] = {
            "episode_id": EPISODE,
            "step_id": sid,
            "opcode": step["opcode"],
            "step_status": status[sid],
            "input_hashes": [] if skipped else [hashes[d] for d in step["depends_on"]],
            "output_hash": None if skipped else hashes[sid],
            "output_size_bytes": 0 if skipped else len(canonical(traces[sid])),
            "duration_ms": 0 if skipped else 5,
            "comparator_tier": "A",
        }
        if step["opcode"] == "ASSERT_HASH":
            payload["assertion_passed"] = False
        step_receipts.append(payload)
    if scenario == "broken_input_hashes":
        step_receipts[2]["input_hashes"] = ["sha256:" + "1" * 64]
    if scenario == "unknown_step_id":
        # s02's receipt names a step the script does not have; everything a verifier
        # recomputes from the known receipts is made consistent, so only the id is wrong
        step_receipts[1]["step_id"] = "s99"
        step_receipts[2]["input_hashes"] = []
    counted = [p for p in step_receipts if p["step_id"] in ("s01", "s02", "s03")]
    open_body = {
        "episode_id": EPISODE,
        "episode_spec_hash": F.h(F.episode_spec_view(contract)),
        "objective": contract["objective"],
        "inputs_hash": F.h(contract["inputs"]),
        "script_hash": F.h(contract["replay_script"]),
        "env_fingerprint_hash": contract["environment"]["env_fingerprint_hash"],
        "replay_basis": "recorded_trace",
        "comparator_tier": "A",
        "n_steps": 3,
    }
    close_body = {
        "episode_id": EPISODE,
        "episode_spec_hash": open_body["episode_spec_hash"],
        "outputs_hash": F.outputs_hash(counted),
        "n_steps_executed": sum(1 for p in counted if p["step_status"] != "SKIPPED"),
        "n_steps_passed": sum(1 for p in counted if p["step_status"] == "PASS"),
        "all_steps_passed": sum(1 for p in counted if p["step_status"] == "PASS") == 3,
        "replay_basis": "recorded_trace",
        "comparator_tier": "A",
    }
    if scenario == "wrong_outputs_hash":
        close_body["outputs_hash"] = F.h([])
    bodies = [(F.OPEN, open_body), *((F.STEP, p) for p in step_receipts), (F.CLOSE, close_body)]
    entries = [
        {
            "receipt_id": f"r_{index:03d}",
            "type": rtype,
            "timestamp": TS,
            "schema_version": "3.0",
            "seq": index,
            "run_id": RUN_ID,
            **body,
        }
        for index, (rtype, body) in enumerate(bodies)
    ]
    pack = root / "pack"
    ProofPack(run_id=RUN_ID, entries=entries, signer_id="rce-fixture").build(
        pack, keystore=AssayKeyStore(root / "keys")
    )
    if scenario == "changed_contract":
        contract["replay_script"]["steps"][1]["params"]["transform"] = "triple"
    if scenario == "contract_without_replay_script":
        del contract["replay_script"]
    (pack / F.CONTRACT).write_text(json.dumps(contract, indent=2))
    (pack / F.INPUTS_DIR).mkdir()
    (pack / F.INPUTS_DIR / "input.json").write_bytes(INPUT)
    (pack / F.TRACES_DIR).mkdir()
    for sid, value in traces.items():
        if status[sid] == "SKIPPED" or (scenario == "missing_trace" and sid == "s02"):
            continue
        if scenario == "rewritten_traces" and sid == "s02":
            value = {"value": 43}
        (pack / F.TRACES_DIR / f"{sid}.json").write_text(json.dumps(value, indent=1))
    return pack
