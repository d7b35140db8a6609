"""The seal formula (core/seal.py) with real Ed25519 keys."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from affidavit.core.seal import Seal, check_signature, key_id_for, seal_message, sign_seal

ROOT = "398d0016b9f62b0b37d824c4fd9502e3507204b21cd99f9f29235a787ec5a422"


def raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def test_message_is_jcs_of_the_five_fields() -> None:
    assert seal_message("job-1", 3, ROOT, "2026-11-22T10:00:00.000000Z", "00112233aabbccdd") == (
        b'{"event_chain_root_hash":"' + ROOT.encode() + b'","event_count":3,'
        b'"job_id":"job-1","key_id":"00112233aabbccdd",'
        b'"sealed_at":"2026-11-22T10:00:00.000000Z"}'
    )


def test_sign_and_check() -> None:
    key = Ed25519PrivateKey.generate()
    seal = sign_seal(key, job_id="job-1", event_count=3, event_chain_root_hash=ROOT, sealed_at="t")
    assert (
        seal.key_id
        == hashlib.sha256(raw_public(key)).hexdigest()[:16]
        == key_id_for(raw_public(key))
    )
    assert len(base64.b64decode(seal.signature)) == 64
    assert check_signature(seal, raw_public(key)) == ""
    assert Seal.from_dict(seal.to_dict()) == seal


@pytest.mark.parametrize(
    "field, value",
    [
        ("job_id", "job-2"),
        ("event_count", 4),
        ("event_chain_root_hash", "0" * 64),
        ("sealed_at", "later"),
    ],
)
def test_any_changed_field_breaks_the_signature(field: str, value: object) -> None:
    key = Ed25519PrivateKey.generate()
    seal = sign_seal(key, job_id="job-1", event_count=3, event_chain_root_hash=ROOT, sealed_at="t")
    changed = Seal.from_dict({**seal.to_dict(), field: value})
    assert check_signature(changed, raw_public(key)) == (
        f"seal signature does not verify with key {seal.key_id}"
    )


def test_wrong_key_bad_signature_and_malformed_input() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    seal = sign_seal(key, job_id="j", event_count=1, event_chain_root_hash=ROOT, sealed_at="t")
    assert "does not match key id" in check_signature(seal, raw_public(other))
    assert "not 32 bytes" in check_signature(seal, b"short")
    garbled = Seal.from_dict({**seal.to_dict(), "signature": "not base64!"})
    assert "not valid base64" in check_signature(garbled, raw_public(key))
    rsa = Seal.from_dict({**seal.to_dict(), "algorithm": "rsa"})
    assert "unsupported" in check_signature(rsa, raw_public(key))
    with pytest.raises(ValueError, match="lacks 'signature'"):
        Seal.from_dict({k: v for k, v in seal.to_dict().items() if k != "signature"})
    with pytest.raises(ValueError, match="event_count"):
        Seal.from_dict({**seal.to_dict(), "event_count": "3"})
