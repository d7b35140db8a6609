"""Erasure receipts: what ``affidavit erase`` signs, logs and hands back (docs/formats.md,
"Erasure receipts").

A receipt file is one JSON object::

    {"type": "affidavit.erasure_receipt/v1",
     "receipt": {"subject_id", "data_key_id", "erased_at", "job_ids", "reason", "key_id"},
     "signature": "<standard base64 of Ed25519 over the message>",
     "tlog_proof": "<c2sp.org/tlog-proof@v1 text>" | null}

The message signed is ``"affidavit.erasure_receipt/v1\n" || JCS(receipt)``; the transparency
log's leaf for it is JCS of ``{"type": "affidavit.erasure/v1", "job_id": "erasure:<subject_id>",
"receipt_sha256": hex SHA-256 of the message}`` (one leaf per subject, first wins).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.checkpoint import TlogProof, verify_tlog_proof
from affidavit.core.errors import AffidavitError, VerificationError
from affidavit.core.merkle import leaf_hash
from affidavit.core.note import Verifier
from affidavit.core.seal import PublicKey, b64, key_id_for, unb64
from affidavit.core.signing import SigningKey

RECEIPT_TYPE = "affidavit.erasure_receipt/v1"
LEAF_TYPE = "affidavit.erasure/v1"
RECORD_PREFIX = "erasure:"
MAX_RECEIPT_BYTES = 16 * 1024 * 1024
MAX_REASON = 1000
_FIELDS = {"subject_id", "data_key_id", "erased_at", "job_ids", "reason", "key_id"}
_HEX64 = re.compile(r"[0-9a-f]{64}")


def message(body: dict[str, Any]) -> bytes:
    """The bytes a receipt's signature covers."""
    return RECEIPT_TYPE.encode() + b"\n" + canonical(body)


def log_leaf(body: dict[str, Any]) -> bytes:
    """The receipt's leaf in the transparency log."""
    return canonical(
        {
            "type": LEAF_TYPE,
            "job_id": RECORD_PREFIX + str(body["subject_id"]),
            "receipt_sha256": hashlib.sha256(message(body)).hexdigest(),
        }
    )


def sign_receipt(key: SigningKey, body: dict[str, Any]) -> dict[str, Any]:
    """The receipt document for ``body``, signed (no tlog proof yet)."""
    return {
        "type": RECEIPT_TYPE,
        "receipt": body,
        "signature": b64(key.private.sign(message(body))),
        "tlog_proof": None,
    }


@dataclass
class ReceiptCheck:
    """The verdict on a receipt file."""

    ok: bool = False
    subject_id: str | None = None
    erased_at: str | None = None
    job_ids: list[str] = field(default_factory=list)
    key_id: str | None = None
    logged: bool | None = None  # None: not asked (no log key given)
    tree_size: int | None = None
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "subject_id": self.subject_id,
            "erased_at": self.erased_at,
            "job_ids": self.job_ids,
            "key_id": self.key_id,
            "logged": self.logged,
            "tree_size": self.tree_size,
            "errors": self.errors,
        }


def parse_receipt(data: bytes) -> dict[str, Any]:
    """A receipt file's document, checked for shape.

    Raises:
        VerificationError: too large, not JSON, or not a receipt (says what is wrong).
    """
    if len(data) > MAX_RECEIPT_BYTES:
        raise VerificationError(f"the receipt is over {MAX_RECEIPT_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise VerificationError("the receipt is not UTF-8 JSON") from None
    if not isinstance(doc, dict) or doc.get("type") != RECEIPT_TYPE:
        raise VerificationError(f"the file is not an {RECEIPT_TYPE} document")
    body = doc.get("receipt")
    if not isinstance(body, dict) or set(body) != _FIELDS:
        raise VerificationError(f"the receipt's fields are not {sorted(_FIELDS)}")
    if not isinstance(body["subject_id"], str) or not _HEX64.fullmatch(body["subject_id"]):
        raise VerificationError("the receipt's subject_id is not 64 hex")
    jobs = body["job_ids"]
    if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
        raise VerificationError("the receipt's job_ids are not a list of text")
    for name in ("data_key_id", "erased_at", "key_id"):
        if not isinstance(body[name], str):
            raise VerificationError(f"the receipt's {name} is not text")
    if body["reason"] is not None and not isinstance(body["reason"], str):
        raise VerificationError("the receipt's reason is not text")
    if not isinstance(doc.get("signature"), str):
        raise VerificationError("the receipt has no signature")
    proof = doc.get("tlog_proof")
    if proof is not None and not isinstance(proof, str):
        raise VerificationError("the receipt's tlog_proof is not text")
    return doc


def verify_receipt(data: bytes, key: PublicKey, log_key: Verifier | None = None) -> ReceiptCheck:
    """Check a receipt file offline: (1) it parses, (2) its signature holds under ``key``
    (whose id it names), (3) with ``log_key``, its tlog-proof is an inclusion proof of the
    receipt's leaf under a checkpoint that key signed. Never raises for a bad receipt."""
    result = ReceiptCheck()
    try:
        doc = parse_receipt(data)  # (1)
        body = doc["receipt"]
        result.subject_id, result.erased_at = body["subject_id"], body["erased_at"]
        result.job_ids, result.key_id = list(body["job_ids"]), body["key_id"]
        if body["key_id"] != key.key_id or key_id_for(key.public_key) != key.key_id:  # (2)
            raise VerificationError(
                f"the receipt was signed with key {body['key_id']}, not {key.key_id}"
            )
        _check_signature(key, message(body), doc["signature"])
        if log_key is not None:  # (3)
            result.logged = False
            if doc["tlog_proof"] is None:
                raise VerificationError(
                    "the receipt carries no transparency-log proof: export it again once the "
                    "log integrated it (`affidavit erase receipt --subject S --out FILE`)"
                )
            proof = TlogProof.parse(doc["tlog_proof"])
            if proof.extra != log_leaf(body):
                raise VerificationError("the proof's leaf is not this receipt's")
            checkpoint, _ = verify_tlog_proof(
                proof, leaf_hash(proof.extra), log_key, [], min_witnesses=0
            )
            result.logged, result.tree_size = True, checkpoint.size
        result.ok = True
    except VerificationError as exc:
        result.errors.append(exc.message)
    except AffidavitError as exc:
        result.errors.append(exc.message)
    return result


def _check_signature(key: PublicKey, signed: bytes, signature: str) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(key.public_key).verify(unb64(signature), signed)
    except (InvalidSignature, ValueError) as exc:
        raise VerificationError(
            f"the receipt's signature does not hold ({exc or 'invalid'})"
        ) from None
