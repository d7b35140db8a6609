"""Packs carry the job's tlog-proof; `pack verify --log-key` checks it; assay still MATCHes.
Both backends."""

from __future__ import annotations

import shutil
from pathlib import Path

from affidavit import Runtime
from affidavit.core.note import COSIGNATURE_V1, NoteSigner, parse_note
from affidavit.packs import export_pack, verify_pack
from affidavit.packs._tlog import TLOG_PROOF
from affidavit.tlog import LogKey, Sequencer, TransparencyLog, default_log_key_path
from tests.cli.test_cli import cli, json_of
from tests.packs.helpers import assay_verify
from tests.verify.helpers import TWO_CHARGES, tools

ORIGIN = "test.example/log"


def test_pack_carries_and_checks_the_log_proof(store_url: str, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    with Runtime(store_url, tools=tools()) as rt:
        jobs = [rt.submit(TWO_CHARGES, {"amount": i}).job_id for i in (1, 2)]
        rt.run_until_idle()
        before = export_pack(rt.store, jobs[0], tmp_path / "unlogged")
        key = LogKey(default_log_key_path(store_url))
        Sequencer(rt.store, key, origin=ORIGIN).integrate()
        vkey = key.verifier(ORIGIN)
        # a witness cosigns the checkpoint and hands it back to the log
        witness = NoteSigner("w.example/w1", Ed25519PrivateKey.generate(), COSIGNATURE_V1)
        log = TransparencyLog(rt.store)
        note = parse_note(log.checkpoint())
        cosigned = note.with_signatures([witness.sign(note.text)]).encode()
        assert log.add_cosignature(cosigned, witness.verifier.vkey())
        pack = export_pack(rt.store, jobs[0], tmp_path / "pack").pack_dir
        other = export_pack(rt.store, jobs[1], tmp_path / "other").pack_dir
    assert not (before.pack_dir / TLOG_PROOF).exists()
    assert (pack / TLOG_PROOF).read_text().startswith("c2sp.org/tlog-proof@v1\n")

    ok = verify_pack(pack, log_key=vkey, witness_keys=[witness.verifier])
    assert ok.verdict == "MATCH", ok.errors
    assert ok.details["transparency_log"]["witnesses"] == ["w.example/w1"]
    assert verify_pack(pack).verdict == "MATCH"  # without --log-key: not checked

    code, receipt, details = assay_verify(pack, tmp_path / "assay-out")
    assert (receipt.get("verdict"), code) == ("MATCH", 0), details or receipt

    stranger = NoteSigner("w.example/w2", Ed25519PrivateKey.generate(), COSIGNATURE_V1)
    missing = verify_pack(pack, log_key=vkey, witness_keys=[stranger.verifier])
    assert missing.verdict == "INTEGRITY_FAIL" and "witness" in " ".join(missing.errors)
    unlogged = verify_pack(before.pack_dir, log_key=vkey)
    assert unlogged.verdict == "INTEGRITY_FAIL"
    assert "carries no transparency-log proof" in " ".join(unlogged.errors)
    # another job's (valid) proof in this pack: not this pack's seal
    shutil.copy(other / TLOG_PROOF, pack / TLOG_PROOF)
    swapped = verify_pack(pack, log_key=vkey)
    assert swapped.verdict == "INTEGRITY_FAIL" and "not the job's seal" in " ".join(swapped.errors)

    # the CLI: exit 2 for INTEGRITY_FAIL, 0 for MATCH
    shutil.copy(tmp_path / "other" / TLOG_PROOF, tmp_path / "other-proof")
    r = cli("pack", "verify", str(other), "--out-dir", str(tmp_path / "v1"), "--log-key",
            vkey.vkey(), "--witness-key", witness.verifier.vkey(), "--json")  # fmt: skip
    assert r.returncode == 0 and json_of(r)["verdict"] == "MATCH", r.stdout + r.stderr
    r = cli("pack", "verify", str(pack), "--out-dir", str(tmp_path / "v2"), "--log-key",
            vkey.vkey(), "--json")  # fmt: skip
    assert r.returncode == 2 and json_of(r)["verdict"] == "INTEGRITY_FAIL"
