"""Retention on both backends: old finished jobs leave the live store once their pack is in the
archive and verified; a tombstone and the seal stay; jobs not finished, held, with a child still
running or a parent still live are kept; a pack that does not verify keeps its job."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.core.errors import IdempotencyConflict
from affidavit.core.signing import SigningKey
from affidavit.packs import verify_pack
from affidavit.retention import (
    Retention,
    RetentionError,
    check_archived,
    hold_job,
    release_job,
    set_policy,
)
from affidavit.runtime._submit import submit_job
from affidavit.store import JobFilter, open_store
from affidavit.verify import verify_all
from tests.conftest import PG_URL
from tests.retention.helpers import (
    LATER,
    finished_jobs,
    integrate,
    live_size,
    one_step,
    removed_rows,
    tools,
    waiting_plan,
)


def test_old_finished_jobs_are_archived_verified_and_removed(
    store_url: str, tmp_path: Path
) -> None:
    ids = finished_jobs(store_url, 3, tags={"plan": "gold"})
    store = open_store(store_url)
    try:
        kept_rows = {j: removed_rows(store, j) for j in ids}
        assert all(r["events"] > 0 and r["tool_invocations"] == 1 for r in kept_rows.values())
        with pytest.raises(RetentionError, match="no retention policy"):
            Retention(store, clock=lambda: LATER).run()
        set_policy(store, 86_400, tmp_path / "archive")
        assert Retention(store).run().archived == {}  # (finished just now: not older than 1d)

        report = Retention(store, clock=lambda: LATER).run()

        assert set(report.archived) == set(ids) and not report.failed
        assert store.list_jobs() == [] and store.list_jobs(JobFilter(tags=[("plan", "gold")])) == []
        for job_id in ids:
            rows = removed_rows(store, job_id)
            assert rows == {
                "jobs": 0,
                "events": 0,
                "tool_invocations": 0,
                "job_tags": 0,
                "seals": 1,  # the seal stays, and its leaf in the log
                "tlog_leaves": 1,
                "archived_jobs": 1,
            }
            pack = Path(report.archived[job_id] or "")
            assert pack == tmp_path / "archive" / f"pack-{job_id}.tar.gz"
            assert verify_pack(pack).ok
            checked = check_archived(store, job_id)
            assert checked is not None and checked.ok and checked.status == "archived"
            assert checked.pack_present and checked.tombstone.pack_path == str(pack)
        total, failed = verify_all(store, JobFilter())  # the kept seals are no orphans
        assert (total, failed) == (0, [])
        assert Retention(store, clock=lambda: LATER).run().archived == {}  # nothing left
    finally:
        store.close()


def test_a_changed_or_missing_pack(store_url: str, tmp_path: Path) -> None:
    job_id, other = finished_jobs(store_url, 2)
    store = open_store(store_url)
    try:
        set_policy(store, 0, tmp_path)
        Retention(store, clock=lambda: LATER).run()
        pack = tmp_path / f"pack-{job_id}.tar.gz"
        pack.write_bytes(pack.read_bytes() + b"\0")
        changed = check_archived(store, job_id)
        assert changed is not None and not changed.ok
        assert "no longer matches" in changed.problems[0]
        (tmp_path / f"pack-{other}.tar.gz").unlink()
        missing = check_archived(store, other)
        assert missing is not None and missing.ok and missing.pack_present is False
        assert check_archived(store, "no-such-job") is None
    finally:
        store.close()


def test_no_archive_keeps_a_tombstone_and_the_seal(store_url: str, tmp_path: Path) -> None:
    (job_id,) = finished_jobs(store_url, 1)
    store = open_store(store_url)
    try:
        set_policy(store, 0, None)
        assert Retention(store, clock=lambda: LATER).run().archived == {job_id: None}
        checked = check_archived(store, job_id)
        assert checked is not None and checked.ok and checked.status == "removed"
        assert list(tmp_path.glob("pack-*")) == []
    finally:
        store.close()


def test_unfinished_held_and_family_jobs_are_kept(store_url: str, tmp_path: Path) -> None:
    held, parent = finished_jobs(store_url, 2)
    with Runtime(store_url, tools=tools()) as rt:
        waiting = rt.submit(waiting_plan(), {}).job_id
        rt.run_until_idle()
        assert rt.get_job(waiting).status == "waiting"
        child, _ = submit_job(rt.store, one_step(), {}, tools=rt.tools, parent=(parent, "a"))
        hold_job(rt.store, held, "case 2026-118")
        set_policy(rt.store, 0, tmp_path)
        retention = Retention(rt.store, clock=lambda: LATER)

        first = retention.run()
        assert first.archived == {}  # held; the parent's child runs; the child is pending
        assert {j.job_id for j in rt.store.list_jobs()} == {held, parent, waiting, child.job_id}

        rt.run_until_idle()  # the child finishes: the parent goes first, then the child
        integrate(rt.store)
        second = retention.run()
        assert list(second.archived) == [parent, child.job_id]
        assert release_job(rt.store, held) and not release_job(rt.store, held)
        assert list(retention.run().archived) == [held]
        assert [j.job_id for j in rt.store.list_jobs()] == [waiting]
        with pytest.raises(RetentionError, match="in the live store"):
            hold_job(rt.store, held, "too late")


def test_a_pack_that_does_not_verify_keeps_its_job(store_url: str, tmp_path: Path) -> None:
    """Signed with a key the store does not record, the pack fails verification: nothing is
    deleted."""
    (job_id,) = finished_jobs(store_url, 1)
    store = open_store(store_url)
    try:
        set_policy(store, 0, tmp_path)
        stranger = SigningKey.load_or_create(tmp_path / "stranger.key")
        report = Retention(store, signing_key=stranger, clock=lambda: LATER).run()
        assert report.archived == {} and "does not verify" in report.failed[job_id]
        assert removed_rows(store, job_id)["events"] > 0
        assert store.get_job(job_id).status == "completed"
    finally:
        store.close()


def test_one_worker_at_a_time(store_url: str, tmp_path: Path) -> None:
    finished_jobs(store_url, 1)
    store = open_store(store_url)
    try:
        set_policy(store, 0, tmp_path)
        holder = Retention(store, owner="a", clock=lambda: LATER)
        assert holder._take_lease()
        busy = Retention(store, owner="b", clock=lambda: LATER).run()
        assert busy.busy and busy.archived == {}
    finally:
        store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def own_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL on a database of its own: on PostgreSQL, VACUUM FULL keeps the rows that a
    snapshot open in the same database may still see, and other tests' sessions share the
    test database (a database's horizon ignores the other databases' sessions)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shrink.db'}"
    name = request.getfixturevalue("pg_database")
    return PG_URL.rsplit("/", 1)[0] + f"/{name}"


def test_the_live_store_shrinks(own_database: str, tmp_path: Path) -> None:
    """Measured as the store is compacted (SQLite: the file after VACUUM; PostgreSQL: the job
    tables after VACUUM FULL): removing jobs gives back at least the bytes of their inputs."""
    store_url = own_database
    with Runtime(store_url, tools=tools()) as rt:
        # (random text: PostgreSQL compresses a repetitive one to almost nothing)
        ids = [
            rt.submit(one_step(n), {"note": secrets.token_urlsafe(3000)}).job_id for n in range(40)
        ]
        rt.run_until_idle()
        integrate(rt.store)
        keep = ids[-4:]
        for job_id in keep:
            hold_job(rt.store, job_id, "kept for the measure")
    before = live_size(store_url)
    store = open_store(store_url)
    try:
        set_policy(store, 0, tmp_path)
        assert len(Retention(store, clock=lambda: LATER).run().archived) == 36
    finally:
        store.close()
    after = live_size(store_url)
    assert before - after >= 36 * 4000, (before, after)


def test_an_archived_jobs_idempotency_key_names_no_second_job(
    store_url: str, tmp_path: Path
) -> None:
    """A key names one job for good: resubmitted after retention removed its job, it creates
    no second job (which would run the side effects again) and writes nothing; the same key in
    another namespace, and another key, still create jobs."""
    [job_id] = finished_jobs(store_url, 1, idempotency_key="refund-A-1001")
    store = open_store(store_url)
    try:
        set_policy(store, 86_400, tmp_path / "archive")
        assert set(Retention(store, clock=lambda: LATER).run().archived) == {job_id}
        checked = check_archived(store, job_id)
        assert checked is not None and checked.tombstone.idempotency_key == "refund-A-1001"
        with Runtime(store_url, tools=tools()) as rt:
            with pytest.raises(IdempotencyConflict, match="retention") as refused:
                rt.submit(one_step(), {}, idempotency_key="refund-A-1001")
            assert job_id in str(refused.value)
            assert rt.store.list_jobs() == []  # nothing written
            other = rt.submit(one_step(), {}, idempotency_key="refund-A-1001", namespace="b")
            fresh = rt.submit(one_step(), {}, idempotency_key="refund-A-1002")
        assert {j.job_id for j in store.list_jobs()} == {other.job_id, fresh.job_id}
    finally:
        store.close()
