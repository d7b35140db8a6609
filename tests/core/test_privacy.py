"""The sealed-value envelope and the subject id, checked against the committed vector with the
primitives themselves (not through the module that writes them), and refused when moved or
edited."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from affidavit.core.canonical import canonical
from affidavit.core.privacy import (
    FileKeyProvider,
    JobCipher,
    MasterKeyError,
    SealedValueError,
    SubjectError,
    check_subject,
    is_sealed,
    seal_payload,
)

VECTOR = json.loads((Path(__file__).parents[1] / "vectors" / "sealed_value_v1.json").read_text())


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def test_the_vector_opens_with_aes_siv_itself() -> None:
    key = bytes.fromhex(VECTOR["data_key_hex"])
    envelope = VECTOR["envelope"]
    aad = [b"affidavit:sealed:v1", VECTOR["job_id"].encode()]
    plain = AESSIV(key).decrypt(_unb64url(envelope["ct"]), aad)
    assert plain == VECTOR["value_jcs"].encode() == canonical(VECTOR["value"])
    assert envelope["kid"] == hashlib.sha256(b"affidavit:data-key-id:" + key).hexdigest()[:16]
    # the writer makes exactly this envelope (AES-SIV is deterministic)
    assert JobCipher(VECTOR["job_id"], key).seal(VECTOR["value"]) == envelope


def test_the_subject_id_is_an_hmac_under_a_key_derived_from_the_master_key() -> None:
    master = bytes.fromhex(VECTOR["master_key_hex"])
    index = hmac.new(master, b"affidavit:subject", hashlib.sha256).digest()
    expected = hmac.new(index, VECTOR["subject"].encode(), hashlib.sha256).hexdigest()
    assert expected == VECTOR["subject_id"] == FileKeyProvider(master).subject_id("customer-7")


def test_an_envelope_opens_in_its_own_job_only_and_not_when_edited() -> None:
    key = bytes.fromhex(VECTOR["data_key_hex"])
    envelope = VECTOR["envelope"]
    with pytest.raises(SealedValueError):
        JobCipher("another-job", key).open(envelope)
    edited = {
        **envelope,
        "ct": envelope["ct"][:-2] + ("AA" if envelope["ct"][-2:] != "AA" else "BB"),
    }
    with pytest.raises(SealedValueError):
        JobCipher(VECTOR["job_id"], key).open(edited)
    with pytest.raises(SealedValueError):
        JobCipher(VECTOR["job_id"], bytes(64)).open(envelope)


def test_an_approval_answer_keeps_approved_in_the_clear() -> None:
    cipher = JobCipher("j", bytes(range(64)))
    vote = {"principal": "p", "approved": True, "comment": "ok for Ada"}
    answer = {"approved": True, "comment": "ok for Ada"}
    payload = {"correlation_key": "k", "payload": answer, "decided_by": [vote]}
    assert seal_payload(cipher, "wait_completed", payload)
    assert payload["payload"]["approved"] is True and is_sealed(payload["payload"]["comment"])
    assert payload["payload"]["comment"] == payload["decided_by"][0]["comment"]
    assert not seal_payload(cipher, "wait_completed", payload)  # sealed once only


def test_wrapped_keys_open_under_their_master_key_only(tmp_path: Path) -> None:
    provider = FileKeyProvider.create(tmp_path / "m.key")
    wrapped = provider.wrap(b"k" * 64, b"subject:s")
    assert FileKeyProvider.load(tmp_path / "m.key").unwrap(wrapped, b"subject:s") == b"k" * 64
    with pytest.raises(MasterKeyError):
        provider.unwrap(wrapped, b"subject:other")
    with pytest.raises(MasterKeyError):
        FileKeyProvider(bytes(32)).unwrap(wrapped, b"subject:s")
    (tmp_path / "m.key").chmod(0o644)
    with pytest.raises(MasterKeyError, match="readable by others"):
        FileKeyProvider.load(tmp_path / "m.key")
    with pytest.raises(MasterKeyError):
        FileKeyProvider.create(tmp_path / "m.key")  # never overwritten


@pytest.mark.parametrize("subject", ["", "  ", "a\x00b", "x" * 257, 7])
def test_a_malformed_subject_is_refused(subject: object) -> None:
    with pytest.raises(SubjectError):
        check_subject(subject)
