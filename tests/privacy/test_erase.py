"""Erasing a subject: its key is gone from the store's files, every proof of its jobs still
verifies, readers show its values as erased, and the erasure leaves a signed receipt."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.core.privacy import ERASED, FileKeyProvider, SubjectError, is_sealed
from affidavit.privacy import erase, find_subject, subject_id, verify_receipt
from affidavit.record import build_from_events, opened_payload
from affidavit.store import open_store
from affidavit.verify import verify_job
from tests.pg_cluster import PrivateCluster, private_cluster_or_skip
from tests.privacy import subject_tools as st
from tests.privacy.conftest import run_everything


def _key_bytes(rt: Runtime, subject: str) -> tuple[bytes, bytes]:
    """The subject's wrapped data key as stored, and the data key itself."""
    sid = subject_id(rt.store, subject)
    with rt.store.transaction() as tx:
        wrapped = bytes(
            tx.query("SELECT wrapped_key FROM subject_keys WHERE subject_id = ?", (sid,))[0][0]
        )
    data_key = rt.store.subjects.provider.unwrap(wrapped, b"subject:" + sid.encode())
    return wrapped, data_key


def _secrets(rt: Runtime, subject: str) -> list[bytes]:
    wrapped, data_key = _key_bytes(rt, subject)
    return [st.CANARY.encode(), wrapped, data_key, data_key[:32], data_key[32:]]


def _sqlite_files(url: str) -> bytes:
    path = url[len("sqlite:///") :]
    return b"".join(
        Path(path + suffix).read_bytes() for suffix in ("", "-wal") if Path(path + suffix).exists()
    )


def test_after_erasure_every_job_verifies_and_reads_as_erased(rt: Runtime) -> None:
    jobs = [run_everything(rt) for _ in range(2)]
    failed = rt.submit("pv_tool_error", {"email": st.CANARY}, subject="customer-7")
    assert rt.run_job(failed.job_id).status == "failed"
    other = rt.submit("pv_simple", {"email": "someone-else"}, subject="customer-8")
    assert rt.run_job(other.job_id).status == "completed"
    before = {j: verify_job(rt.store, j).execution_hash for j in [*jobs, failed.job_id]}
    done = erase(rt.store, "customer-7", sealer=rt.sealer, reason="art. 17 request #12")
    assert done.erased_now and done.scrubbed
    assert done.receipt["receipt"]["job_ids"] == sorted(
        [*jobs, failed.job_id], key=[*jobs, failed.job_id].index
    )
    for job_id, execution_hash in before.items():
        result = verify_job(rt.store, job_id)
        assert result.ok, result
        assert result.execution_hash == execution_hash  # the record did not change
        assert rt.store.job_key(job_id) == (done.receipt["receipt"]["subject_id"], None)
    events = rt.store.list_events(jobs[0])
    shown = [opened_payload(e, None) for e in events]
    assert shown[0]["input"] == ERASED
    by_type = {e.type: p for e, p in zip(events, shown, strict=True)}
    assert by_type["step_called"]["args"] == ERASED
    assert by_type["job_completed"]["output"] == ERASED
    assert by_type["tool_invocation_finished"]["result"] == ERASED
    replay = build_from_events(events)  # (a reader without the key still reads the record)
    assert replay.status == "completed"
    # the other subject is untouched
    assert rt.store.job_key(other.job_id) is not None
    assert rt.store.job_key(other.job_id)[1] is not None  # type: ignore[index]
    assert find_subject(rt.store, "customer-7").erased_at is not None


def test_sqlite_files_hold_no_canary_nor_key_after_erasure(
    tmp_path: Path, master_key: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'scan.db'}"
    with Runtime(url, tools=st.registry(), master_key=master_key) as rt:
        for n in range(40):  # several pages of keys: the erased one among them
            job = rt.submit("pv_simple", {"email": f"user{n}"}, subject=f"filler-{n}")
            rt.run_job(job.job_id)
        run_everything(rt)
        secrets = _secrets(rt, "customer-7")
        assert secrets[1] in _sqlite_files(url)  # (the scan can see the key before)
        erase(rt.store, "customer-7", sealer=rt.sealer)
        found = _sqlite_files(url)
        for secret in secrets:
            assert secret not in found


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    yield from private_cluster_or_skip()


def test_postgres_data_directory_holds_no_canary_nor_key_after_erasure(
    cluster: PrivateCluster, master_key: Path
) -> None:
    import psycopg

    with psycopg.connect(cluster.url, autocommit=True) as conn:
        # (a recycled WAL segment keeps its old bytes until it is overwritten: docs/privacy.md)
        conn.execute("ALTER SYSTEM SET wal_recycle = off")
        conn.execute("SELECT pg_reload_conf()")
    url = cluster.create_database("erasure")
    with Runtime(url, tools=st.registry(), master_key=master_key) as rt:
        for n in range(40):
            job = rt.submit("pv_simple", {"email": f"user{n}"}, subject=f"filler-{n}")
            rt.run_job(job.job_id)
        run_everything(rt)
        secrets = _secrets(rt, "customer-7")
        assert any(secrets[1] in data for data in _tree(cluster.data))
        done = erase(rt.store, "customer-7", sealer=rt.sealer)
        assert done.scrubbed
        for data in _tree(cluster.data):
            for secret in secrets:
                assert secret not in data
        assert verify_job(rt.store, done.receipt["receipt"]["job_ids"][0]).ok


def _tree(root: Path) -> Iterator[bytes]:
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                yield path.read_bytes()
            except OSError:
                continue


def test_erase_refuses_while_a_job_of_the_subject_is_not_finished(rt: Runtime) -> None:
    job = rt.submit("pv_everything", {"email": st.CANARY}, subject="customer-7")
    assert rt.run_job(job.job_id).status == "waiting"
    with pytest.raises(SubjectError, match="not finished"):
        erase(rt.store, "customer-7", sealer=rt.sealer)
    assert find_subject(rt.store, "customer-7").erased_at is None
    assert rt.store.job_key(job.job_id)[1] is not None  # type: ignore[index]
    rt.signal(job.job_id, "details", {"x": 1})  # the job goes on
    assert rt.run_job(job.job_id).status == "waiting"


def test_an_erased_subject_takes_no_new_job(rt: Runtime) -> None:
    job = rt.submit("pv_simple", {"email": st.CANARY}, subject="customer-7")
    rt.run_job(job.job_id)
    erase(rt.store, "customer-7", sealer=rt.sealer)
    with pytest.raises(SubjectError, match="erased"):
        rt.submit("pv_simple", {"email": st.CANARY}, subject="customer-7")


def test_erase_of_an_unknown_subject_is_refused(rt: Runtime) -> None:
    with pytest.raises(SubjectError, match="no job was ever submitted"):
        erase(rt.store, "nobody", sealer=rt.sealer)


def test_a_plan_job_takes_no_subject(rt: Runtime) -> None:
    plan = {"name": "p", "nodes": [{"id": "a", "type": "tool", "tool": "pv_send_email",
                                     "args": {"to": "x", "body": "y"}}]}  # fmt: skip
    with pytest.raises(SubjectError, match="agent jobs"):
        rt.submit(plan, {}, subject="customer-7")


def test_the_receipt_verifies_offline_and_a_changed_one_does_not(rt: Runtime) -> None:
    import json

    job = rt.submit("pv_simple", {"email": st.CANARY}, subject="customer-7")
    rt.run_job(job.job_id)
    done = erase(rt.store, "customer-7", sealer=rt.sealer, reason="request")
    key = rt.sealer.key().public
    text = json.dumps(done.receipt).encode()
    check = verify_receipt(text, key)
    assert check.ok, check.errors
    assert check.job_ids == [job.job_id]
    forged = json.loads(text)
    forged["receipt"]["job_ids"] = []
    assert not verify_receipt(json.dumps(forged).encode(), key).ok
    assert not verify_receipt(b"[1, 2", key).ok
    # erasing again finishes what a crash left, and hands back the same receipt
    again = erase(rt.store, "customer-7", sealer=rt.sealer)
    assert not again.erased_now
    assert again.receipt["signature"] == done.receipt["signature"]


_ERASE_SCRIPT = """
import sys
from affidavit.core.privacy import FileKeyProvider
from affidavit.privacy import erase
from affidavit.record import Sealer
from affidavit.store import open_store
store = open_store(sys.argv[1])
store.subjects.use(FileKeyProvider.load(sys.argv[2]))
erase(store, "customer-7", sealer=Sealer(sys.argv[3]))
"""


@pytest.mark.parametrize("point", ["erase.before_commit", "erase.after_commit"])
def test_a_process_killed_during_erase_loses_nothing(
    store_url: str, master_key: Path, tmp_path: Path, point: str
) -> None:
    key_file = tmp_path / "seal.key"
    from affidavit.record import Sealer

    with Runtime(store_url, tools=st.registry(), master_key=master_key, signing_key=key_file) as rt:
        job_id = run_everything(rt)
    env = {**os.environ, "AFFIDAVIT_CRASH_AT": point}
    run = subprocess.run(
        [sys.executable, "-c", _ERASE_SCRIPT, store_url, str(master_key), str(key_file)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert run.returncode == -9, run.stderr
    store = open_store(store_url)
    try:
        store.subjects.use(FileKeyProvider.load(master_key))
        erased = find_subject(store, "customer-7").erased_at is not None
        assert erased == (point == "erase.after_commit")
        assert verify_job(store, job_id).ok
        done = erase(store, "customer-7", sealer=Sealer(key_file))
        assert done.erased_now == (point == "erase.before_commit")
        assert verify_job(store, job_id).ok
        assert store.job_key(job_id)[1] is None  # type: ignore[index]
        assert all(not is_sealed(e.payload) for e in store.list_events(job_id))
    finally:
        store.close()
