"""The signed part of an exported pack: the attestation, the build-time verify report and
transcript, the manifest over the hash-covered files and its Ed25519 signature."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.events import utc_now
from affidavit.core.signing import SigningKey
from affidavit.packs import _format as F
from affidavit.store import JobRecord
from affidavit.verify import VerificationResult


def dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def attestation_of(
    job_id: str, policy: Any, receipts: list[dict[str, Any]], lines: list[bytes]
) -> dict[str, Any]:
    """The pack's attestation (its hash is the pack's identity, ``pack_root_sha256``)."""
    now = datetime.now(UTC)
    stamps = [str(r["timestamp"]) for r in receipts]
    suite_id = "affidavit"
    return {
        "pack_format_version": "0.1.0",
        "fingerprint_version": 1,
        "pack_id": f"pack_{now.strftime('%Y%m%dT%H%M%S')}_{uuid.uuid4().hex[:8]}",
        "run_id": job_id,
        "suite_id": suite_id,
        "suite_hash": F.sha256_hex(suite_id.encode()),
        "verifier_version": dist_version("affidavit"),
        "canon_version": "jcs-rfc8785",
        "canon_impl": "rfc8785",
        "canon_impl_version": dist_version("rfc8785"),
        "policy_hash": F.sha256_hex(canonical(policy)),
        "claim_set_id": "none",
        "claim_set_hash": F.sha256_hex(b"none"),
        "receipt_integrity": "PASS",
        "claim_check": "N/A",
        "discrepancy_fingerprint": None,
        "assurance_level": "L0",
        "proof_tier": "signed-pack",
        "mode": "shadow",
        "head_hash": F.sha256_hex(lines[-1]),
        "head_hash_algorithm": "last-receipt-digest-v0",
        "time_authority": "local_clock",
        "n_receipts": len(receipts),
        "timestamp_start": min(stamps),
        "timestamp_end": max(stamps),
        "ci_binding": None,
        "valid_until": None,
        "superseded_by": None,
    }


def report_of(
    attestation: dict[str, Any], receipt_bytes: bytes, check: VerificationResult
) -> dict[str, Any]:
    """``verify_report.json``: the build-time receipt check and the job's verification."""
    return {
        "passed": True,
        "errors": [],
        "warnings": [],
        "receipt_count": attestation["n_receipts"],
        "head_hash": attestation["head_hash"],
        "verified_at": utc_now(),
        "verifier": {"name": "affidavit", "version": attestation["verifier_version"]},
        "pack_id": attestation["pack_id"],
        "run_id": attestation["run_id"],
        "pack_root_sha256": F.sha256_hex(canonical(attestation)),
        "receipt_pack_sha256": F.sha256_hex(receipt_bytes),
        "job_verification": check.to_dict(),
    }


def transcript_of(
    job: JobRecord,
    attestation: dict[str, Any],
    payloads: list[dict[str, Any]],
    check: VerificationResult,
) -> bytes:
    counts: dict[str, int] = {}
    for p in payloads:
        counts[p["step_status"]] = counts.get(p["step_status"], 0) + 1
    lines = [
        f"# Proof pack {attestation['pack_id']}",
        "",
        f"- job: `{job.job_id}` ({job.status}), plan `{job.plan_name}`",
        f"- receipts: {attestation['n_receipts']}, head hash `{attestation['head_hash']}`",
        "- steps: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        f"- event chain root `{check.event_chain_root_hash}`",
        f"- execution hash `{check.execution_hash}`",
        "",
        "Verify offline: `affidavit pack verify PACK_DIR --out-dir OUT` "
        "(or `assay rce-verify PACK_DIR --out-dir OUT`).",
        "",
    ]
    return "\n".join(lines).encode()


def sign_manifest(
    attestation: dict[str, Any], files: dict[str, bytes], signing_key: SigningKey
) -> tuple[bytes, bytes]:
    """The manifest (its bytes as written) and its signature, over ``files``' hash-covered
    entries."""
    public_raw = signing_key.public_raw
    attestation_sha256 = F.sha256_hex(canonical(attestation))
    unsigned = {
        "pack_id": attestation["pack_id"],
        "pack_version": "0.1.0",
        "manifest_version": "1.0.0",
        "hash_alg": "sha256",
        "attestation": attestation,
        "attestation_sha256": attestation_sha256,
        "suite_hash": attestation["suite_hash"],
        "claim_set_id": attestation["claim_set_id"],
        "claim_set_hash": attestation["claim_set_hash"],
        "receipt_count_expected": attestation["n_receipts"],
        # the event log among the hash-covered files: assay's verifier checks the SHA-256 of
        # every file listed here (it reads nothing else of events.ndjson), ours re-verifies it
        "files": [
            {"path": name, "sha256": F.sha256_hex(files[name]), "bytes": len(files[name])}
            for name in (*F.HASHED_KERNEL_FILES, F.EVENTS)
        ],
        "expected_files": list(F.KERNEL_FILES),
        "signer_id": signing_key.key_id,
        "signer_pubkey": base64.b64encode(public_raw).decode("ascii"),
        "signer_pubkey_sha256": F.sha256_hex(public_raw),
        "signature_alg": "ed25519",
        "signature_scope": F.SIGNATURE_SCOPE,
    }
    signature = signing_key.private.sign(canonical(unsigned))
    manifest = {
        **unsigned,
        "signature": base64.b64encode(signature).decode("ascii"),
        "pack_root_sha256": attestation_sha256,
    }
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), signature
