"""After a subject is erased, every verifier still passes for each of its jobs: Verification
Mode, proof packs exported before and after (ours and assay's ``rce-verify``), disclosures, and
the transparency log, which also proves the erasure receipt."""

from __future__ import annotations

import json
from pathlib import Path

from affidavit import Runtime
from affidavit.packs import export_pack, verify_pack
from affidavit.privacy import erase, stored_receipt, verify_receipt
from affidavit.tlog import (
    LogKey,
    Sequencer,
    TransparencyLog,
    check_proof,
    disclose,
    verify_disclosure,
)
from affidavit.verify import verify_job
from tests.packs.helpers import assay_verify
from tests.privacy import subject_tools as st
from tests.privacy.conftest import run_everything

ORIGIN = "affidavit.test/erasure"


def test_packs_disclosures_and_the_log_verify_after_erasure(rt: Runtime, tmp_path: Path) -> None:
    job_id = run_everything(rt)
    failed = rt.submit("pv_tool_error", {"email": st.CANARY}, subject="customer-7")
    assert rt.run_job(failed.job_id).status == "failed"
    log_key = LogKey(tmp_path / "log.key")
    Sequencer(rt.store, log_key, origin=ORIGIN).integrate()
    before = {j: export_pack(rt.store, j, tmp_path / f"before-{j}").pack_dir
              for j in (job_id, failed.job_id)}  # fmt: skip
    disclosed_before = disclose(rt.store, job_id, "#0")

    done = erase(rt.store, "customer-7", sealer=rt.sealer, reason="request")
    Sequencer(rt.store, log_key, origin=ORIGIN).integrate()
    verifier = log_key.verifier(ORIGIN)
    seal_key = rt.sealer.key().public
    for j in (job_id, failed.job_id):
        assert verify_job(rt.store, j).ok
        after = export_pack(rt.store, j, tmp_path / f"after-{j}").pack_dir
        for pack in (before[j], after):
            assert st.CANARY.encode() not in b"".join(
                p.read_bytes() for p in pack.rglob("*") if p.is_file()
            )
            ours = verify_pack(pack, log_key=verifier)
            assert (ours.verdict, ours.exit_code) == ("MATCH", 0), ours.errors
            code, receipt, details = assay_verify(pack, tmp_path / f"assay-{pack.name}")
            assert (code, receipt.get("verdict")) == (0, "MATCH"), details
        proof = TransparencyLog(rt.store).job_proof(j).encode()
        assert check_proof(proof, verifier).errors == []
    for document in (disclosed_before, disclose(rt.store, job_id, "#0")):
        check = verify_disclosure(
            json.dumps(document).encode(), [seal_key.public_key], log_key=verifier
        )
        assert check.error == "", check.error
    # the receipt is in the log, and its proof travels with it
    logged = stored_receipt(rt.store, "customer-7")
    assert logged["tlog_proof"] is not None
    assert logged["signature"] == done.receipt["signature"]
    check = verify_receipt(json.dumps(logged).encode(), seal_key, verifier)
    assert check.ok and check.logged, check.errors
    assert sorted(check.job_ids) == sorted([job_id, failed.job_id])
