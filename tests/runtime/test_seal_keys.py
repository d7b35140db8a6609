"""Which seal keys a database accepts (record/_sealing.py, store/_sealkeys.py): the first key
that seals registers itself, any other one refuses to start until an operator registers it;
rotation retires the old key; verification takes the registered keys or the pinned ones."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from affidavit import Runtime, verify_job
from affidavit.core.seal import b64
from affidavit.core.signing import SealKeyRefused
from affidavit.record._sealing import Sealer, SigningKey, trust_key
from affidavit.store import Store, open_store
from tests.verify.helpers import TWO_CHARGES, RawDb, tools


def key_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "keys" / name
    SigningKey.load_or_create(path)
    return path


def run_one(url: str, key: Path) -> str:
    """Submit a job and run it with the key at ``key``; return its id."""
    with Runtime(url, tools=tools(), signing_key=key) as rt:
        job_id = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        return job_id


def test_a_second_key_refuses_to_start_with_the_remedy(store_url: str, tmp_path: Path) -> None:
    first, second = key_file(tmp_path, "a.key"), key_file(tmp_path, "b.key")
    run_one(store_url, first)
    with Runtime(store_url, tools=tools(), signing_key=second) as rt:
        job_id = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
        with pytest.raises(SealKeyRefused) as refused:
            rt.run_until_idle()
        assert rt.get_job(job_id).status == "pending"  # nothing ran
        assert "node_started" not in [e.type for e in rt.store.list_events(job_id)]
        public = SigningKey.load(second).public
        assert [k.key_id for k in rt.store.signing_keys()] == [SigningKey.load(first).key_id]
    error = refused.value
    assert f"seal key {public.key_id}" in error.message and "not registered" in error.message
    assert f"affidavit keys trust {public.public_key_b64}" in error.hint
    assert "affidavit keys rotate" in error.hint


def test_a_trusted_key_starts_and_each_seal_names_its_key(store_url: str, tmp_path: Path) -> None:
    first, second = key_file(tmp_path, "a.key"), key_file(tmp_path, "b.key")
    a, b = SigningKey.load(first), SigningKey.load(second)
    job_a = run_one(store_url, first)
    store = open_store(store_url)
    try:
        assert trust_key(store, b.public) == "unregistered"
        assert trust_key(store, b.public) == "active"  # again: unchanged
        job_b = run_one(store_url, second)
        seal_a, seal_b = store.get_seal(job_a), store.get_seal(job_b)
        assert seal_a is not None and seal_b is not None
        assert (seal_a.key_id, seal_b.key_id) == (a.key_id, b.key_id)
        for job_id in (job_a, job_b):
            assert verify_job(store, job_id).ok  # the registered keys
        # an auditor pins one key: only its seals verify
        pinned = verify_job(store, job_a, trusted_keys=[b.public.public_key_b64])
        assert not pinned.ok
        assert pinned.seal.error == (
            f"the seal is signed by unknown key {a.key_id} (not one of the trusted keys)"
        )
        assert verify_job(store, job_b, trusted_keys=[b.public.public_key_b64]).ok
    finally:
        store.close()


def test_rotation_retires_the_old_key(store_url: str, tmp_path: Path) -> None:
    path = key_file(tmp_path, "host.key")
    old_copy = tmp_path / "copy.key"  # another host still holding the old key
    old_copy.write_bytes(path.read_bytes())
    old_copy.chmod(0o600)
    old_job = run_one(store_url, path)
    store = open_store(store_url)
    try:
        old, new = Sealer(path).rotate(store)
        assert old is not None
        status = {k.key_id: k.retired_at for k in store.signing_keys()}
        assert status[old.key_id] is not None and status[new.key_id] is None
        with pytest.raises(SealKeyRefused, match="is retired in this database"):
            Sealer(old_copy).admit(store)
        new_job = run_one(store_url, path)  # the key file now holds the new key
        for job_id, key_id in ((old_job, old.key_id), (new_job, new.key_id)):
            result = verify_job(store, job_id)
            assert result.ok and result.seal.key_id == key_id
    finally:
        store.close()


def test_rotating_an_unregistered_key_does_not_register_it(store_url: str, tmp_path: Path) -> None:
    """The remedy for a refused host: its new key is registered, its old one stays unknown."""
    run_one(store_url, key_file(tmp_path, "a.key"))
    refused = key_file(tmp_path, "b.key")
    unknown = SigningKey.load(refused).key_id
    store = open_store(store_url)
    try:
        _, new = Sealer(refused).rotate(store)
        assert unknown not in {k.key_id for k in store.signing_keys()}
        assert new.key_id in {k.key_id for k in store.signing_keys()}
    finally:
        store.close()
    run_one(store_url, refused)


@pytest.mark.parametrize("same_key", [False, True])
def test_racing_registrations_on_an_empty_store_register_one_key(
    store_url: str, same_key: bool
) -> None:
    """Eight workers (each its own connection) admit their keys at once on an empty store:
    one key is registered; the others refuse, unless they hold that same key."""
    shared = SigningKey.generate()
    keys = [shared if same_key else SigningKey.generate() for _ in range(8)]
    stores: list[Store] = [open_store(store_url) for _ in keys]
    barrier = threading.Barrier(len(keys))
    outcome: dict[int, str] = {}

    def admit(i: int) -> None:
        barrier.wait()
        try:
            Sealer(key=keys[i]).admit(stores[i])
            outcome[i] = "admitted"
        except SealKeyRefused:
            outcome[i] = "refused"

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(len(keys))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        registered = stores[0].signing_keys()
        assert len(registered) == 1
        winners = [i for i, o in outcome.items() if o == "admitted"]
        assert len(outcome) == len(keys)
        assert len(winners) == (len(keys) if same_key else 1)
        assert all(keys[i].key_id == registered[0].key_id for i in winners)
    finally:
        for s in stores:
            s.close()


def test_a_seal_by_an_unregistered_key_written_by_sql_is_reported(
    store_url: str, tmp_path: Path
) -> None:
    """Someone with database access re-signs a job's seal with a key of their own (without
    registering it): verification names the key as not registered."""
    job_id = run_one(store_url, key_file(tmp_path, "a.key"))
    store = open_store(store_url)
    try:
        before = verify_job(store, job_id)
        seal = store.get_seal(job_id)
        assert seal is not None
        forger = SigningKey.generate()
        forged = forger.seal(job_id, seal.event_count, seal.event_chain_root_hash, seal.events_root)
        RawDb(store_url).execute(
            "UPDATE seals SET key_id = ?, signature = ?, sealed_at = ? WHERE job_id = ?",
            (forged.key_id, forged.signature, forged.sealed_at, job_id),
        )
        after = verify_job(store, job_id)
    finally:
        store.close()
    assert before.ok and not after.ok
    assert after.seal.error == (
        f"the seal is signed by unknown key {forger.key_id} (not registered in this database)"
    )


def test_a_key_id_registered_with_another_public_key_is_refused(
    store_url: str, tmp_path: Path
) -> None:
    path = key_file(tmp_path, "a.key")
    run_one(store_url, path)
    key = SigningKey.load(path)
    other = SigningKey.generate()
    RawDb(store_url).execute(
        "UPDATE signing_keys SET public_key = ? WHERE key_id = ?",
        (b64(other.public_raw), key.key_id),
    )
    store = open_store(store_url)
    try:
        with pytest.raises(SealKeyRefused, match="with another public key"):
            Sealer(path).admit(store)
    finally:
        store.close()


def test_a_sealer_never_admitted_checks_in_the_sealing_transaction(
    store_url: str, tmp_path: Path
) -> None:
    """A job sealed by a sealer that skipped admission (library use) is refused in the
    transaction that would seal it: no seal by an unregistered key is written."""
    run_one(store_url, key_file(tmp_path, "a.key"))
    store = open_store(store_url)
    try:
        job, _ = store.create_job(plan_name="p", events=[])
        sealer = Sealer(key=SigningKey.generate())
        with pytest.raises(SealKeyRefused), store.transaction() as tx:
            sealer.seal_txn(tx, job.job_id)
        assert store.get_seal(job.job_id) is None
    finally:
        store.close()
