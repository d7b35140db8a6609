"""The registry of checks (``affidavit.verify.CHECKS``) is what the result, the verifier and the
faces read: the result's fields, its object (docs/formats.md §6), its verdict and its report
follow the registry, and the places that cannot read it (the API's schema, the trace page, the
docs) list exactly its checks."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from affidavit.api.models import Verification
from affidavit.verify import CHECKS, VerificationResult, verify_events
from affidavit.verify._parts import LedgerProof, ReplayProof, SealCheck, StoredChainCheck

ROOT = Path(__file__).resolve().parents[2]
NAMES = [c.name for c in CHECKS]
PROOFS = [c.name for c in CHECKS if c.proof]


def _result(**failing: object) -> VerificationResult:
    parts: dict[str, object] = {
        "execution_hash": "e" * 64,
        "event_chain_root_hash": "r" * 64,
        "tool_invocation_ledger_proof": LedgerProof(True),
        "replay_proof_result": ReplayProof(True),
        "stored_chain": StoredChainCheck(True, None, 3),
        "seal": SealCheck(True, True, "k" * 16, 3),
    }
    parts.update(failing)
    return VerificationResult(job_id="j", **parts)  # type: ignore[arg-type]


def test_the_result_has_one_field_per_check_in_registry_order() -> None:
    fields = [f.name for f in dataclasses.fields(VerificationResult)]
    assert fields[1 : 1 + len(CHECKS)] == NAMES
    assert list(_result().to_dict()) == ["job_id", *NAMES, "ok"]
    assert [c.name for c in _result().checks()] == NAMES


def test_every_proof_decides_the_verdict_and_reports_its_failure() -> None:
    assert _result().ok
    failing = {  # name -> (the failing part, its detail in the report)
        "tool_invocation_ledger_proof": (
            LedgerProof(False, errors=("ledger row x… appears twice",)),
            "ledger row x… appears twice",
        ),
        "replay_proof_result": (
            ReplayProof(False, "plan at version 2: bad", "plan", 2),
            "plan at version 2: bad",
        ),
        "stored_chain": (StoredChainCheck(False, 2, 3), "first bad version: 2"),
        "seal": (
            SealCheck(True, False, error="the seal covers 2 events, the log has 3"),
            "the seal covers 2 events, the log has 3",
        ),
    }
    assert list(failing) == PROOFS
    for name, (part, detail) in failing.items():
        result = _result(**{name: part})
        assert not result.ok and result.to_dict()["ok"] is False
        [bad] = [c for c in result.checks() if not c.ok]
        assert (bad.name, bad.detail) == (name, detail)


def test_the_values_hold_whatever_they_are() -> None:
    values = [c for c in CHECKS if not c.proof]
    assert [c.name for c in values] == ["execution_hash", "event_chain_root_hash"]
    report = {c.name: c for c in _result(stored_chain=StoredChainCheck(False, 1, 3)).checks()}
    assert report["execution_hash"].ok and report["execution_hash"].detail == "e" * 64


def test_the_verifier_runs_the_registry() -> None:
    """``verify_events`` of no log fills every check of the registry (the replay proof fails:
    the log is empty)."""
    result = verify_events([], job_id="j")
    doc = result.to_dict()
    assert list(doc) == ["job_id", *NAMES, "ok"]
    assert doc["replay_proof_result"] == {"ok": False, "error": "plan: the log is empty"}
    assert not result.ok


def test_the_api_schema_lists_every_check() -> None:
    # (and when the server computed the answer, which a sealed job's is kept: docs/api.md)
    assert list(Verification.model_fields) == [
        "job_id",
        *NAMES,
        "ok",
        "forked_from",
        "computed_at",
        "cached",
    ]


def test_the_trace_page_shows_every_proof() -> None:
    app = (ROOT / "src/affidavit/api/static/app.js").read_text()
    block = app[app.index("const PROOFS = [") :]
    block = block[: block.index("];")]
    assert sorted(re.findall(r"\(v\) => v\.(\w+)", block)) == sorted(PROOFS)  # (its own order)


def test_the_docs_table_is_the_registry() -> None:
    doc = (ROOT / "docs/verification.md").read_text()
    section = doc[doc.index("## The checks") :]
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \| ", section, flags=re.MULTILINE)
    rows = rows[: len(CHECKS)]
    assert rows == [(c.name, c.proves) for c in CHECKS]
