"""Phase 2 of docs/packs.md: the pack's integrity — the manifest (schema, file hashes, expected
files), the receipts (count, recomputed integrity, head hash), the attestation hash, the
signature with the embedded key (and the trusted keys, when pinned), and timestamps."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from affidavit.core.canonical import canonical, canonical_parsed_all
from affidavit.core.errors import AffidavitError
from affidavit.core.seal import PublicKey
from affidavit.packs import _format as F
from affidavit.packs._files import read, safe_path
from affidavit.packs._json import canonicalizable, hex_value, loads, loads_lines
from affidavit.packs._schemas import schema_errors
from affidavit.packs._state import FUTURE_SKEW, Fail, State, parse_time, rtype

# assay's proof-pack receipt vocabulary: these flat legacy names, or a dotted namespaced type
_ALLOWED_FLAT = frozenset(
    {
        "ai_workflow",
        "capability_use",
        "challenge",
        "decision_v1",
        "governance_posture_snapshot",
        "grace_check",
        "guardian_check",
        "guardian_verdict",
        "mcp_tool_call",
        "model_call",
        "refusal",
        "revocation",
        "session_metadata",
        "supersession",
    }
)
_NAMESPACED = re.compile(r"^[a-z0-9_]+(?:\.[a-z0-9_]+)+(?:/[a-z0-9_]+)?\Z")


def check_integrity(st: State, trusted: set[bytes] | None, now: datetime) -> None:
    try:
        manifest = loads(read(st.root / F.MANIFEST, F.MANIFEST, st.max_file_bytes), F.MANIFEST)
    except Fail as exc:
        st.errors.append(str(exc))
        return
    if not isinstance(manifest, dict):
        st.errors.append(f"{F.MANIFEST}: not a JSON object")
        return
    st.manifest = manifest
    st.errors.extend(f"{F.MANIFEST}: {e}" for e in schema_errors(F.SCHEMA_NAMES[1], manifest))
    files = manifest.get("files")
    receipts_path = st.root / F.RECEIPTS
    receipts_bytes: bytes | None = None  # read once: hashed here, parsed below
    for entry in files if isinstance(files, list) else []:
        if not isinstance(entry, dict):
            continue
        rel = entry.get("path")
        try:
            path = safe_path(st.root, rel, f"{F.MANIFEST} files")
            data = read(path, str(rel), st.max_file_bytes)
        except Fail as exc:
            st.errors.append(str(exc))
            continue
        if path == receipts_path:
            receipts_bytes = data
        if F.sha256_hex(data) != entry.get("sha256"):
            st.errors.append(f"{rel}: sha256 does not match the manifest")
        if entry.get("bytes") != len(data):
            st.warnings.append(f"{rel}: size differs from the manifest")
    expected = manifest.get("expected_files")
    for name in expected if isinstance(expected, list) else []:
        try:
            if not safe_path(st.root, name, f"{F.MANIFEST} expected_files").is_file():
                st.errors.append(f"{name}: expected file missing")
        except Fail as exc:
            st.errors.append(str(exc))
    for name in F.KERNEL_FILES:
        if not (st.root / name).is_file() and not any(e.startswith(name) for e in st.errors):
            st.errors.append(f"{name}: missing")
    _receipts_check(st, manifest, receipts_bytes)
    attestation = manifest.get("attestation")
    try:
        if manifest.get("attestation_sha256") != hex_value(attestation):
            st.errors.append(f"{F.MANIFEST}: attestation_sha256 does not match the attestation")
        if manifest.get("pack_root_sha256") != manifest.get("attestation_sha256"):
            st.errors.append(f"{F.MANIFEST}: pack_root_sha256 is not attestation_sha256")
    except Fail as exc:
        st.errors.append(f"{F.MANIFEST}: attestation {exc}")
    _signature_check(st, manifest, trusted)
    if isinstance(attestation, dict):
        stamp = attestation.get("timestamp_end") or attestation.get("timestamp_start")
        when = parse_time(stamp)
        if when is not None and when - now > FUTURE_SKEW:
            st.errors.append(f"{F.MANIFEST}: attestation timestamp {stamp} is in the future")


def _receipts_check(st: State, manifest: dict[str, Any], read_before: bytes | None) -> None:
    try:
        data = (
            read_before
            if read_before is not None
            else read(st.root / F.RECEIPTS, F.RECEIPTS, st.max_file_bytes)
        )
    except Fail as exc:
        if not any(e.startswith(F.RECEIPTS) for e in st.errors):
            st.errors.append(str(exc))
        return
    try:
        receipts, strict = loads_lines(data, F.RECEIPTS)
    except Fail as exc:
        st.errors.append(str(exc))
        return
    st.receipts = receipts
    st.kinds = kinds = [rtype(r) for r in receipts]
    if manifest.get("receipt_count_expected") != len(receipts):
        st.errors.append(
            f"{F.RECEIPTS}: {len(receipts)} receipts, the manifest expects "
            f"{manifest.get('receipt_count_expected')!r}"
        )
    # Every receipt must canonicalize, but only the last one's hash is needed (the head): when
    # one pass shows that all of them do, only the last is hashed.
    all_canonical = strict and canonicalizable(receipts)
    integrity_ok, head = _walk(st, receipts, kinds, all_canonical)
    _check_attestation(st, manifest, bool(receipts), integrity_ok, head)


def _walk(
    st: State, receipts: list[Any], kinds: list[str], all_canonical: bool
) -> tuple[bool, str | None]:
    """Each receipt's fields and type; returns whether the receipts' integrity holds and the
    head hash (the last receipt's)."""
    integrity_ok = True
    seen: set[str] = set()
    head: str | None = None
    known_kinds: dict[str, bool] = {}
    for index, receipt in enumerate(receipts):
        if not isinstance(receipt, dict):
            st.errors.append(f"{F.RECEIPTS}: receipt {index} is not an object")
            integrity_ok = False
            head = None
            continue
        for name in ("receipt_id", "type", "timestamp"):
            if not receipt.get(name):
                integrity_ok = False
        if receipt.get("timestamp") is not None and parse_time(receipt["timestamp"]) is None:
            integrity_ok = False
        rid = receipt.get("receipt_id")
        if isinstance(rid, str) and rid:
            if rid in seen:
                integrity_ok = False
            seen.add(rid)
        kind = kinds[index]
        allowed = known_kinds.get(kind)
        if allowed is None:
            allowed = known_kinds[kind] = _allowed_kind(kind)
        if not allowed:
            st.errors.append(f"{F.RECEIPTS}: receipt {index} has unsupported type {kind!r}")
        if kind.startswith("loom."):
            st.errors.append(f"{F.RECEIPTS}: receipt {index} has unsupported type {kind!r}")
        if not _ascii_keys(receipt):
            integrity_ok = False
        if not all_canonical:
            try:
                head = hex_value(F.receipt_body(receipt))
            except Fail:
                integrity_ok = False
                head = None
    if all_canonical and receipts:
        last = receipts[-1]  # often the ledger receipt: a row per tool call
        head = (
            F.sha256_hex(canonical_parsed_all([F.receipt_body(last)])[0])
            if isinstance(last, dict)
            else None
        )
    return integrity_ok, head


def _check_attestation(
    st: State, manifest: dict[str, Any], any_receipt: bool, integrity_ok: bool, head: str | None
) -> None:
    """The attestation's claimed receipt integrity and head hash against the recomputed."""
    attestation = manifest.get("attestation")
    if not isinstance(attestation, dict):
        return
    claimed = attestation.get("receipt_integrity")
    if claimed and claimed != ("PASS" if integrity_ok else "FAIL"):
        st.errors.append(
            f"{F.RECEIPTS}: recomputed receipt integrity is "
            f"{'PASS' if integrity_ok else 'FAIL'}, the attestation claims {claimed!r}"
        )
    claimed_head = attestation.get("head_hash")
    if claimed_head:
        if not any_receipt:
            head = F.sha256_hex(b"empty")
        if head != claimed_head:
            st.errors.append(f"{F.RECEIPTS}: head hash does not match the attestation")


def _allowed_kind(kind: str) -> bool:
    return not kind or kind in _ALLOWED_FLAT or bool(_NAMESPACED.match(kind))


def _ascii_keys(receipt: dict[str, Any]) -> bool:
    try:
        return "".join(receipt).isascii()  # a parsed object's keys are strings
    except TypeError:
        return False


def _signature_check(st: State, manifest: dict[str, Any], trusted: set[bytes] | None) -> None:
    signature_b64 = manifest.get("signature")
    try:
        if not isinstance(signature_b64, str) or not signature_b64:
            raise Fail(f"{F.MANIFEST}: no signature")
        try:
            signature = base64.b64decode(signature_b64, validate=True)
        except (binascii.Error, ValueError):
            raise Fail(f"{F.MANIFEST}: signature is not base64") from None
        try:
            detached = read(st.root / F.SIGNATURE, F.SIGNATURE, st.max_file_bytes)
        except Fail as exc:
            st.errors.append(str(exc))
        else:
            if detached != signature:
                st.errors.append(f"{F.SIGNATURE}: does not match the manifest signature")
        pub_b64 = manifest.get("signer_pubkey")
        try:
            public = base64.b64decode(pub_b64 if isinstance(pub_b64, str) else "", validate=True)
        except (binascii.Error, ValueError):
            raise Fail(f"{F.MANIFEST}: signer_pubkey is not base64") from None
        if len(public) != 32:
            raise Fail(f"{F.MANIFEST}: signer_pubkey is not a 32-byte Ed25519 key")
        if manifest.get("signer_pubkey_sha256") != F.sha256_hex(public):
            raise Fail(f"{F.MANIFEST}: signer_pubkey does not match signer_pubkey_sha256")
        unsigned = {k: v for k, v in manifest.items() if k not in F.MANIFEST_UNSIGNED}
        try:
            message = canonical(unsigned)
        except (AffidavitError, RecursionError):
            raise Fail(f"{F.MANIFEST}: cannot be canonicalized") from None
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
        except (InvalidSignature, ValueError):
            raise Fail(f"{F.MANIFEST}: signature does not verify with signer_pubkey") from None
        if trusted is not None and public not in trusted:
            raise Fail(
                f"{F.MANIFEST}: signer not trusted (key id {PublicKey.from_raw(public).key_id})"
            )
    except Fail as exc:
        st.errors.append(str(exc))
