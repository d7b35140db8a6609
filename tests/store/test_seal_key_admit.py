"""``Transaction.seal_key_admit`` on both backends: the first key registers, the same key is
accepted, another is not, a retired one says so, a key id recorded with another public key is
a mismatch; a refusal writes nothing."""

from __future__ import annotations

from affidavit.core.seal import PublicKey
from affidavit.core.signing import SigningKey
from affidavit.store import SealKeyAdmission, Store


def admit(store: Store, key: PublicKey) -> SealKeyAdmission:
    with store.transaction() as tx:
        return tx.seal_key_admit(key, at="2026-01-01T00:00:00.000000Z")


def test_seal_key_admission(store: Store) -> None:
    first, second = SigningKey.generate().public, SigningKey.generate().public
    assert admit(store, first) == SealKeyAdmission(first.key_id, "active", registered_now=True)
    assert admit(store, first) == SealKeyAdmission(first.key_id, "active")
    assert admit(store, second) == SealKeyAdmission(second.key_id, "unregistered")
    assert [k.key_id for k in store.signing_keys()] == [first.key_id]  # nothing written
    assert not admit(store, second).accepted

    with store.transaction() as tx:
        tx.key_retire(first.key_id, retired_at="2026-01-02T00:00:00.000000Z")
    retired = admit(store, first)
    assert (retired.status, retired.accepted) == ("retired", True)

    impostor = PublicKey(first.key_id, second.public_key)  # the id of one, the bytes of another
    assert admit(store, impostor).status == "mismatch"
    keys = store.signing_keys()
    assert [(k.key_id, k.public_key) for k in keys] == [(first.key_id, first.public_key)]
