"""Same verdict and exit code as assay on packs assay builds, and the schemas we ship agree
with assay's (when the reference copies are present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affidavit.packs import _format as F
from affidavit.packs import verify_pack
from affidavit.packs.verify import result_errors
from tests.packs import assay_packs
from tests.packs.helpers import assay_verify

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "assay-rce-schemas"


@pytest.mark.parametrize("scenario", sorted(assay_packs.SCENARIOS))
def test_same_verdict_as_assay(tmp_path: Path, scenario: str) -> None:
    pack = assay_packs.build(tmp_path, scenario)
    code, receipt, details = assay_verify(pack, tmp_path / "assay-out")
    expected = assay_packs.SCENARIOS[scenario]
    assert (receipt.get("verdict"), code) == expected, details or receipt
    ours = verify_pack(pack)
    assert (ours.verdict, ours.exit_code) == expected, ours.errors
    assert ours.receipt["parent_hashes"] == receipt["parent_hashes"]
    assert ours.receipt["episode_spec_hash"] == receipt["episode_spec_hash"]
    assert ours.receipt["script_hash"] == receipt["script_hash"]
    assert ours.receipt["original_pack_root_sha256"] == receipt["original_pack_root_sha256"]
    assert ours.receipt["divergent_step_ids"] == receipt["divergent_step_ids"]
    assert ours.details.get("affidavit", {"present": False}) == {"present": False}
    assert result_errors(ours.receipt) == []


@pytest.mark.parametrize("scenario", assay_packs.CRASHES)
def test_integrity_fail_where_assay_crashes(tmp_path: Path, scenario: str) -> None:
    pack = assay_packs.build(tmp_path, scenario)
    code, receipt, _ = assay_verify(pack, tmp_path / "assay-out")
    # assay raises on these (no verdict written); should it ever answer, it must not be MATCH
    assert "crash" in receipt or receipt.get("verdict") != "MATCH"
    assert code not in (0, 1)
    ours = verify_pack(pack)
    assert (ours.verdict, ours.exit_code) == ("INTEGRITY_FAIL", 2)
    assert ours.errors
    assert result_errors(ours.receipt) == []


def _normalized(schema: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in schema.items() if k != "$id"}


@pytest.mark.skipif(
    not REFERENCE.is_dir(),
    reason=f"assay's reference schemas are not present at {REFERENCE} (outside this repository's "
    "workspace); the shipped schemas are then checked only by the other tests",
)
@pytest.mark.parametrize("name", F.SCHEMA_NAMES)
def test_schemas_agree_with_assay_reference(name: str) -> None:
    reference = json.loads((REFERENCE / name).read_text())
    assert _normalized(F.schema(name)) == _normalized(reference)
