"""verify_pack and `affidavit pack verify` / `rce-verify` on exported packs: MATCH, tampering,
phase 5 (the job's own log), signer pinning, exit codes and output files."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from affidavit.cli.main import load_commands
from affidavit.core.canonical import canonical
from affidavit.packs import _format as F
from affidavit.packs import export_pack, verify_pack
from affidavit.packs.verify import result_errors
from tests.packs.helpers import JOB_KINDS, assay_verify, resign, run_job

app = load_commands()  # every command

runner = CliRunner()


def _export(make_runtime: Callable[..., Any], tmp_path: Path, kind: str = "refund") -> Path:
    rt, job_id = run_job(make_runtime, kind, tmp_path / "data")
    return export_pack(rt.store, job_id, tmp_path / "pack").pack_dir


@pytest.mark.parametrize("kind", JOB_KINDS)
def test_match_on_exported_packs(
    make_runtime: Callable[..., Any], tmp_path: Path, kind: str
) -> None:
    pack = _export(make_runtime, tmp_path, kind)
    verdict = verify_pack(pack)
    assert (verdict.verdict, verdict.exit_code, verdict.errors) == ("MATCH", 0, [])
    assert verdict.details["affidavit"]["present"] is True
    assert verdict.details["affidavit"]["job_verification"]["seal"]["ok"] is True
    assert result_errors(verdict.receipt) == []
    close = next(
        json.loads(line)
        for line in (pack / F.RECEIPTS).read_text().splitlines()
        if json.loads(line)["type"] == F.CLOSE
    )
    assert verdict.receipt["parent_hashes"] == [F.receipt_hash(close)]
    assert verdict.receipt["verifier_id"] == "affidavit-rce-verify-py"
    assert verdict.details["signer"]["trust"].startswith("self-attested")


def _files(pack: Path) -> list[str]:
    # _unsigned/ holds human sidecars that nothing binds (assay ignores them too)
    return sorted(
        p.relative_to(pack).as_posix()
        for p in pack.rglob("*")
        if p.is_file() and not p.relative_to(pack).as_posix().startswith("_unsigned/")
    )


def test_every_file_flipped_or_removed_is_integrity_fail(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    pack = _export(make_runtime, tmp_path, "failed")
    names = _files(pack)
    assert len(names) >= 10
    for name in names:
        for how in ("flip", "remove"):
            copy = tmp_path / f"t-{how}"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(pack, copy)
            target = copy / name
            if how == "remove":
                target.unlink()
            else:
                data = bytearray(target.read_bytes())
                data[len(data) // 2] ^= 0x01
                target.write_bytes(bytes(data))
            verdict = verify_pack(copy)
            assert verdict.verdict == "INTEGRITY_FAIL", (name, how, verdict.errors)
            assert verdict.exit_code == 2
            assert any(name in e for e in verdict.errors), (name, how, verdict.errors)
            assert result_errors(verdict.receipt) == []


def test_edited_event_log_fails_for_both_verifiers_and_in_phase_5_when_resigned(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    pack = _export(make_runtime, tmp_path)
    lines = (pack / F.EVENTS).read_text().splitlines()
    event = json.loads(lines[0])
    event["payload"]["input"]["order_id"] = "A-9999"
    lines[0] = canonical(event).decode()
    (pack / F.EVENTS).write_text("\n".join(lines) + "\n")
    verdict = verify_pack(pack)
    assert (verdict.verdict, verdict.phase) == ("INTEGRITY_FAIL", 2)
    assert f"{F.EVENTS}: sha256 does not match the manifest" in verdict.errors
    # the manifest lists the log among its hash-covered files: assay's verifier, which reads
    # nothing else of it, catches the edit too
    code, receipt, details = assay_verify(pack, tmp_path / "assay-out")
    assert (code, receipt["verdict"]) == (2, "INTEGRITY_FAIL")
    assert any("events.ndjson" in e for e in details["errors"]), details
    # re-hashed and re-signed by the key's holder: the job's seal in the log does not move
    resign(pack)
    resigned = verify_pack(pack)
    assert (resigned.verdict, resigned.phase) == ("INTEGRITY_FAIL", 5)
    assert any(e.startswith(F.EVENTS) for e in resigned.errors)


def _rewrite_receipts(pack: Path, receipts: list[dict[str, Any]]) -> None:
    """Re-hash everything the signature covers, but do not re-sign."""
    for prev, cur in itertools.pairwise(receipts):
        cur["parent_hashes"] = [F.receipt_hash(prev)]
    lines = [canonical(F.receipt_body(r)) for r in receipts]
    data = b"\n".join(lines) + b"\n"
    (pack / F.RECEIPTS).write_bytes(data)
    manifest = json.loads((pack / F.MANIFEST).read_text())
    for entry in manifest["files"]:
        if entry["path"] == F.RECEIPTS:
            entry.update(sha256=F.sha256_hex(data), bytes=len(data))
    manifest["attestation"]["head_hash"] = F.sha256_hex(lines[-1])
    manifest["attestation_sha256"] = F.sha256_hex(canonical(manifest["attestation"]))
    manifest["pack_root_sha256"] = manifest["attestation_sha256"]
    (pack / F.MANIFEST).write_text(json.dumps(manifest, indent=2))


def test_traces_changed_and_rehashed_but_not_resigned(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    pack = _export(make_runtime, tmp_path, "charges")
    receipts = [json.loads(line) for line in (pack / F.RECEIPTS).read_text().splitlines()]
    step = next(r for r in receipts if r["type"] == F.STEP and r["opcode"] == "APPLY_TRANSFORM")
    trace = {"charged": 1_000_000, "key": "forged"}
    trace_bytes = canonical(trace)
    old_hash = step["output_hash"]
    (pack / F.TRACES_DIR / f"{step['step_id']}.json").write_bytes(trace_bytes)
    step["output_hash"] = F.prefixed(trace_bytes)
    step["output_size_bytes"] = len(trace_bytes)
    # the dependent step's input_hashes follow the forged output, so the chain stays intact
    for r in receipts:
        if r["type"] == F.STEP and r.get("input_hashes"):
            r["input_hashes"] = [
                step["output_hash"] if h == old_hash else h for h in r["input_hashes"]
            ]
    _rewrite_receipts(pack, receipts)
    verdict = verify_pack(pack)
    assert (verdict.verdict, verdict.phase) == ("INTEGRITY_FAIL", 2)
    assert any("signature does not verify" in e for e in verdict.errors)
    code, receipt, _ = assay_verify(pack, tmp_path / "assay-out")
    assert (code, receipt["verdict"]) == (2, "INTEGRITY_FAIL")


def test_rewritten_trace_is_diverge_for_assay_and_integrity_fail_with_the_log(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    pack = _export(make_runtime, tmp_path, "charges")
    receipts = [json.loads(line) for line in (pack / F.RECEIPTS).read_text().splitlines()]
    step = next(r for r in receipts if r["type"] == F.STEP and r["opcode"] == "APPLY_TRANSFORM")
    (pack / F.TRACES_DIR / f"{step['step_id']}.json").write_text('{"charged": 99}')
    verdict = verify_pack(pack)
    assert verdict.verdict == "INTEGRITY_FAIL"
    assert [d["step_id"] for d in verdict.details["divergent_steps"]] == [step["step_id"]]
    assert any("differs from the event log" in e for e in verdict.errors)
    code, receipt, _ = assay_verify(pack, tmp_path / "assay-out")
    assert (code, receipt["verdict"]) == (1, "DIVERGE")


def test_trusted_key_pins_the_signer(make_runtime: Callable[..., Any], tmp_path: Path) -> None:
    pack = _export(make_runtime, tmp_path)
    manifest = json.loads((pack / F.MANIFEST).read_text())
    own = base64.b64decode(manifest["signer_pubkey"])
    assert verify_pack(pack, trusted_keys=[own]).verdict == "MATCH"
    other = verify_pack(pack, trusted_keys=[bytes(32)])
    assert other.verdict == "INTEGRITY_FAIL"
    assert any("signer not trusted" in e for e in other.errors)


@pytest.mark.parametrize("command", [["pack", "verify"], ["rce-verify"]])
def test_cli_verify(make_runtime: Callable[..., Any], tmp_path: Path, command: list[str]) -> None:
    pack = _export(make_runtime, tmp_path)
    out = tmp_path / "out"
    res = runner.invoke(app, [*command, str(pack), "--out-dir", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc == {
        "command": "rce-verify",
        "status": "ok",
        "verdict": "MATCH",
        "receipt_path": str(out / F.RESULT_FILE),
        "details_path": str(out / F.DETAILS_FILE),
        "exit_code": 0,
    }
    written = json.loads((out / F.RESULT_FILE).read_text())
    assert written["verdict"] == "MATCH" and result_errors(written) == []
    assert json.loads((out / F.DETAILS_FILE).read_text())["phase"] == 4
    # the out dir exists now: usage error unless --overwrite
    again = runner.invoke(app, [*command, str(pack), "--out-dir", str(out)])
    assert again.exit_code == 3
    pretty = runner.invoke(
        app, [*command, str(pack), "--out-dir", str(out), "--overwrite", "--pretty"]
    )
    assert pretty.exit_code == 0
    assert (out / F.RESULT_FILE).read_text().startswith("{\n  ")
    missing = runner.invoke(app, [*command, str(tmp_path / "nope"), "--out-dir", str(out)])
    assert missing.exit_code == 3
    (pack / F.SIGNATURE).write_bytes(b"x" * 64)
    bad = runner.invoke(app, [*command, str(pack), "--out-dir", str(out), "--overwrite"])
    assert bad.exit_code == 2
    assert json.loads((out / F.RESULT_FILE).read_text())["verdict"] == "INTEGRITY_FAIL"


@pytest.mark.parametrize("what", ["trace", "traces_dir"])
def test_symlink_out_of_the_pack_is_integrity_fail(
    make_runtime: Callable[..., Any], tmp_path: Path, what: str
) -> None:
    pack = _export(make_runtime, tmp_path, "charges")
    outside = tmp_path / "outside"
    shutil.copytree(pack / F.TRACES_DIR, outside)
    if what == "trace":
        victim = next((pack / F.TRACES_DIR).iterdir())
        victim.unlink()
        victim.symlink_to(outside / victim.name)
    else:
        shutil.rmtree(pack / F.TRACES_DIR)
        (pack / F.TRACES_DIR).symlink_to(outside)
    verdict = verify_pack(pack)
    assert verdict.verdict == "INTEGRITY_FAIL"
    assert any("escapes the pack directory" in e for e in verdict.errors), verdict.errors


@pytest.mark.parametrize("what", ["trace", "traces_dir", "manifest_file"])
def test_symlink_loop_is_integrity_fail(tmp_path: Path, what: str) -> None:
    # Path.resolve() raises RuntimeError on a loop before Python 3.13: not a crash, a failure
    from tests.packs import assay_packs

    pack = assay_packs.build(tmp_path, "valid")
    if what == "trace":
        victim = pack / F.TRACES_DIR / "s02.json"
        victim.unlink()
        victim.symlink_to(victim.name)
    elif what == "traces_dir":
        shutil.rmtree(pack / F.TRACES_DIR)
        (pack / F.TRACES_DIR).symlink_to(F.TRACES_DIR)
    else:
        (pack / "loop").symlink_to("loop")
        manifest = json.loads((pack / F.MANIFEST).read_text())
        manifest["files"][0]["path"] = "loop"
        (pack / F.MANIFEST).write_text(json.dumps(manifest))
    verdict = verify_pack(pack)
    assert verdict.verdict == "INTEGRITY_FAIL"
    assert any("escapes the pack directory" in e for e in verdict.errors), verdict.errors
    assert result_errors(verdict.receipt) == []


def test_timestamps_in_the_future_are_integrity_fail(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta

    pack = _export(make_runtime, tmp_path, "charges")
    stamp = json.loads((pack / F.MANIFEST).read_text())["attestation"]["timestamp_end"]
    end = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert verify_pack(pack, now=end - timedelta(hours=23)).verdict == "MATCH"
    early = verify_pack(pack, now=end - timedelta(hours=25))
    assert early.verdict == "INTEGRITY_FAIL"
    assert any("in the future" in e for e in early.errors)
    assert verify_pack(pack, now=datetime.now(UTC)).verdict == "MATCH"


def test_usage_error_is_exit_3(tmp_path: Path) -> None:
    import subprocess
    import sys

    binary = Path(sys.executable).parent / "affidavit"
    for args in (["rce-verify", str(tmp_path)], ["pack", "verify", str(tmp_path), "--bogus"]):
        proc = subprocess.run([str(binary), *args], capture_output=True, timeout=60, check=False)
        assert proc.returncode == 3, (args, proc.stderr)


def test_a_trusted_key_file_of_another_algorithm_is_a_usage_error(
    make_runtime: Callable[..., Any], tmp_path: Path
) -> None:
    """An RSA or EC key file given as --trusted-key is refused (exit 3, the usage-error code),
    not a traceback exiting 1 (which `pack verify` means as DIVERGE)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    pack = _export(make_runtime, tmp_path)
    for name, private in (
        ("rsa", rsa.generate_private_key(public_exponent=65537, key_size=1024)),
        ("ec", ec.generate_private_key(ec.SECP256R1())),
    ):
        public = private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        secret = private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        for kind, data in (("pub", public), ("key", secret)):
            key_file = tmp_path / f"{name}.{kind}.pem"
            key_file.write_bytes(data)
            result = runner.invoke(
                app,
                ["pack", "verify", str(pack), "--out-dir", str(tmp_path / "out"), "--json",
                 "--trusted-key", str(key_file)],
            )  # fmt: skip
            assert result.exit_code == 3, (key_file.name, result.output)
            error = json.loads(result.stdout)["error"]
            assert error["code"] == "config_error" and "not an Ed25519 key" in error["message"]
