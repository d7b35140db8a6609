"""Signing keys and the seal written with a job's terminal event (record/_sealing.py)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from affidavit import Runtime, verify_job
from affidavit.record._sealing import (
    KEY_ENV,
    Sealer,
    SigningKey,
    SigningKeyError,
    default_key_path,
)
from affidavit.store import Transaction
from affidavit.store._seals import SealOps
from affidavit.verify.repair import seal_unsealed
from tests.runtime.helpers import wait_lease_expired
from tests.verify.helpers import (
    CHARGE_THEN_APPROVAL,
    LEASE,
    TWO_CHARGES,
    RawDb,
    SimulatedCrash,
    tools,
)


def test_default_key_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(KEY_ENV)
    assert default_key_path(f"sqlite:///{tmp_path}/data/a.db") == (
        tmp_path / "data" / "affidavit-signing.key"
    )
    monkeypatch.chdir(tmp_path)
    assert default_key_path("sqlite:///./rel.db") == tmp_path / "affidavit-signing.key"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_key_path("postgresql://u@h/db") == (
        tmp_path / "xdg" / "affidavit" / "affidavit-signing.key"
    )
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "elsewhere.key"))
    assert default_key_path(f"sqlite:///{tmp_path}/a.db") == tmp_path / "elsewhere.key"


def test_key_created_on_first_use_next_to_the_sqlite_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(KEY_ENV)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Runtime(url, tools=tools()) as rt:
        key_file = tmp_path / "affidavit-signing.key"
        assert not key_file.exists()
        job_id = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
        rt.run_until_idle()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        seal = rt.store.get_seal(job_id)
        assert seal is not None
        assert seal.key_id == SigningKey.load(key_file).key_id
        assert verify_job(rt.store, job_id).ok


def test_load_or_create_is_one_key_under_races(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "k.key"
    ids: list[str] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        ids.append(SigningKey.load_or_create(path).key_id)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["k.key"]  # no temp files left


def test_unsafe_or_wrong_key_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    SigningKey.load_or_create(path)
    os.chmod(path, 0o644)
    with pytest.raises(SigningKeyError, match="accessible by group or others") as info:
        SigningKey.load(path)
    assert "chmod 600" in info.value.hint
    ec_key = ec.generate_private_key(ec.SECP256R1())
    wrong = tmp_path / "ec.key"
    wrong.write_bytes(ec_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    os.chmod(wrong, 0o600)
    with pytest.raises(SigningKeyError, match="not Ed25519"):
        SigningKey.load(wrong)
    garbage = tmp_path / "g.key"
    garbage.write_bytes(b"not a key")
    os.chmod(garbage, 0o600)
    with pytest.raises(SigningKeyError, match="not an unencrypted PEM"):
        SigningKey.load(garbage)


def test_worker_refuses_to_start_with_an_unusable_key(store_url: str, tmp_path: Path) -> None:
    """A key problem stops the worker before it claims a job — not after the job's side
    effects, when it is about to be sealed."""
    path = tmp_path / "open.key"
    SigningKey.load_or_create(path)
    os.chmod(path, 0o644)
    with Runtime(store_url, tools=tools(), signing_key=path) as rt:
        job_id = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
        with pytest.raises(SigningKeyError):
            rt.run_until_idle()
        assert rt.get_job(job_id).status == "pending"
        assert [e.type for e in rt.store.list_events(job_id)] == ["job_created", "plan_generated"]


class CrashAfterSealing(Sealer):
    """Dies inside the terminal transaction, after the seal was written into it."""

    def __init__(self, path: Path, armed: list[bool]) -> None:
        super().__init__(path)
        self.armed = armed

    def seal_txn(self, tx: Transaction, job_id: str, **kw: Any):  # type: ignore[no-untyped-def]
        seal = super().seal_txn(tx, job_id, **kw)
        if self.armed[0]:
            self.armed[0] = False
            raise SimulatedCrash("inside the terminal transaction")
        return seal


def test_terminal_event_and_seal_commit_together(
    store_url: str, tmp_path: Path, raw_db: Callable[[], RawDb]
) -> None:
    """A crash inside the terminal transaction leaves neither the terminal event nor the seal;
    the recovered run writes both."""
    key_path = Path(os.environ[KEY_ENV])
    with Runtime(store_url, tools=tools(), lease_seconds=LEASE) as rt:
        rt.worker.sealer = CrashAfterSealing(key_path, [True])
        job_id = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
        with pytest.raises(SimulatedCrash):
            rt.run_until_idle()
        assert rt.get_job(job_id).status == "running"
        assert "job_completed" not in [e.type for e in rt.store.list_events(job_id)]
        assert rt.store.get_seal(job_id) is None
        assert verify_job(rt.store, job_id).ok  # a crashed run is just in flight

        wait_lease_expired(rt.store, job_id)
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        result = verify_job(rt.store, job_id)
        assert result.ok and result.seal.present


def test_a_run_seals_with_the_chain_hashes_it_read_and_wrote(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run knows every chain hash of its job's log — those it read when it started and
    those it appended — and seals with them, without reading the log back; the seal's events
    root is the stored log's."""
    with Runtime(store_url, tools=tools()) as rt:
        job_id = rt.submit(CHARGE_THEN_APPROVAL).job_id
        rt.run_until_idle()  # charges, then waits: the second run starts from a stored log
        rt.signal(job_id, f"{job_id}:ok", {"approved": True}, approver="ann")

        def unread(self: SealOps, job_id: str) -> list[bytes]:
            raise AssertionError("a run read its log's chain hashes back to seal it")

        with monkeypatch.context() as patched:
            patched.setattr(SealOps, "seal_chain_hashes", unread)
            rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        result = verify_job(rt.store, job_id)
        assert result.ok and result.seal.present
        seal = rt.store.get_seal(job_id)
        assert seal is not None and seal.version == 2


@pytest.fixture
def raw_db(store_url: str) -> Callable[[], RawDb]:
    return lambda: RawDb(store_url)


def test_seal_unsealed_repairs_only_jobs_that_verify(
    store_url: str, raw_db: Callable[[], RawDb]
) -> None:
    raw = raw_db()
    with Runtime(store_url, tools=tools()) as rt:
        intact = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
        damaged = rt.submit(TWO_CHARGES, {"amount": 2}).job_id
        rt.run_until_idle()
        raw.execute("DELETE FROM seals")  # as if they finished before seals existed
        raw.execute(
            "UPDATE events SET payload = ? WHERE job_id = ? AND version = 3", (b"{}", damaged)
        )
        report = seal_unsealed(rt.store, rt.sealer)
        assert [s.job_id for s in report.sealed] == [intact]
        assert list(report.refused) == [damaged]
        assert "stored_chain" in report.refused[damaged]
        assert verify_job(rt.store, intact).ok
        assert rt.store.get_seal(damaged) is None
        assert seal_unsealed(rt.store, rt.sealer).sealed == []  # idempotent


def test_rotation_keeps_old_seals_verifying(store_url: str, tmp_path: Path) -> None:
    with Runtime(store_url, tools=tools()) as rt:
        before = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
        rt.run_until_idle()
        old, new = rt.sealer.rotate(rt.store)
        assert old is not None and old.key_id != new.key_id
        after = rt.submit(TWO_CHARGES, {"amount": 2}).job_id
        rt.run_until_idle()
        seals = {j: rt.store.get_seal(j) for j in (before, after)}
        assert seals[before].key_id == old.key_id  # type: ignore[union-attr]
        assert seals[after].key_id == new.key_id  # type: ignore[union-attr]
        assert verify_job(rt.store, before).ok and verify_job(rt.store, after).ok
        keys = {k.key_id: k for k in rt.store.signing_keys()}
        assert keys[old.key_id].retired_at is not None and keys[new.key_id].retired_at is None
