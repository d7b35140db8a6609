"""Stores opened read-only (``open_store(url, read_only=True)``), as ``affidavit verify`` and
``affidavit jobs`` open them: an auditor with a read-only copy, a read-only mount or a role
with SELECT rights alone can read and verify, and nothing is created, migrated or written.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.errors import MigrationError, StoreError
from affidavit.store import NewEvent, Store, migrations, open_store
from affidavit.store.migrations import VERSION_TABLE
from affidavit.verify import verify_job
from tests.cli.test_cli import cli, json_of
from tests.conftest import PG_URL, with_schema
from tests.runtime.helpers import node, plan
from tests.store.legacy import undo_migration_6


def finished_job(url: str) -> str:
    """A completed, sealed job of one tool step, written by the runtime."""

    def echo(ctx: ToolContext, x: int) -> dict[str, int]:
        return {"x": x}

    with Runtime(url, tools=ToolRegistry((Tool("echo", echo, "tool"),))) as rt:
        job_id = rt.submit(plan(node("a", "echo", args={"x": 1})), {}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        return job_id


def counts(store: Store, job_id: str) -> tuple[int, int]:
    return len(store.list_jobs()), len(store.list_events(job_id))


def test_reads_and_verifies_and_writes_nothing(store_url: str) -> None:
    job_id = finished_job(store_url)
    store = open_store(store_url, read_only=True)
    try:
        before = counts(store, job_id)
        assert verify_job(store, job_id).ok
        assert store.get_job(job_id).status == "completed"
        with pytest.raises(StoreError, match=r"read-only|readonly"):
            store.append(job_id, [NewEvent("node_started", {"node_id": "a"})], expected_version=8)
        with pytest.raises(StoreError, match=r"read-only|readonly"):
            store.create_job(plan_name="forged")
        assert counts(store, job_id) == before
    finally:
        store.close()


def test_a_missing_sqlite_file_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    with pytest.raises(StoreError, match="no SQLite database at") as caught:
        open_store(f"sqlite:///{path}", read_only=True)
    assert "never create" in caught.value.hint
    assert list(tmp_path.iterdir()) == []


def test_a_schema_behind_this_version_is_not_migrated(store_url: str) -> None:
    job_id = finished_job(store_url)
    writer = open_store(store_url)
    try:
        with writer.transaction() as tx:  # as if migrations 5 (seals) and on were not applied
            rows = tx.query(f"SELECT version, name, applied_at FROM {VERSION_TABLE} "
                            "WHERE version >= 5")  # fmt: skip
            tx.execute(f"DELETE FROM {VERSION_TABLE} WHERE version >= 5")
        with pytest.raises(MigrationError, match="at version 4, older") as caught:
            open_store(store_url, read_only=True)
        assert "affidavit db migrate" in caught.value.hint
        assert writer.schema_version() == 4  # not migrated by the attempt
        with writer.transaction() as tx:
            for row in rows:
                tx.execute(f"INSERT INTO {VERSION_TABLE} VALUES (?, ?, ?)", tuple(row))
    finally:
        writer.close()
    store = open_store(store_url, read_only=True)
    try:
        assert verify_job(store, job_id).ok
    finally:
        store.close()


def test_a_copy_made_before_migration_6_is_read_as_it_is(store_url: str) -> None:
    """Migration 6 changed how SQLite keys a job's log, and narrowed a unique key: a store
    opened read-only (which never migrates) reads a database without it by the old key."""
    assert [m.version for m in migrations.load("sqlite") if m.older_schema_readable] == [
        6,
        7,
        8,
        10,
        11,
        12,
        13,
        15,
        17,
        18,
        19,
        20,
        21,
        22,
        23,
        24,
        25,
        27,
    ]
    job_id = finished_job(store_url)
    undo_migration_6(store_url)
    store = open_store(store_url, read_only=True)
    try:
        assert store.schema_version() == 5
        result = verify_job(store, job_id)
        assert result.ok and result.stored_chain.event_count == len(store.list_events(job_id))
        assert [e.version for e in store.list_events(job_id, after_version=3, limit=2)] == [4, 5]
        assert store.get_job(job_id).version == result.stored_chain.event_count
    finally:
        store.close()


def test_a_database_without_the_schema_is_refused(empty_store_url: str, tmp_path: Path) -> None:
    if empty_store_url.startswith("sqlite:///"):
        Path(empty_store_url[len("sqlite:///") :]).write_bytes(b"")  # an empty file
    with pytest.raises(MigrationError, match="no affidavit schema"):
        open_store(empty_store_url, read_only=True)


def test_sqlite_evidence_copy_in_a_read_only_directory(tmp_path: Path) -> None:
    """A copy of the database file alone (no -wal, no -shm) in a directory nobody may write:
    SQLite cannot create the shared-memory file WAL mode reads through, so the store opens the
    unchanging file as immutable."""
    job_id = finished_job(f"sqlite:///{tmp_path / 'live.db'}")
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    (evidence / "copy.db").write_bytes((tmp_path / "live.db").read_bytes())
    # the test runs as root, for whom permission bits do not stop writes; the immutable
    # attribute does
    locked = subprocess.run(["chattr", "+i", str(evidence)], capture_output=True, check=False)
    if locked.returncode != 0:
        pytest.skip(f"cannot make a directory immutable here: {locked.stderr.decode().strip()}")
    try:
        store = open_store(f"sqlite:///{evidence / 'copy.db'}", read_only=True)
        try:
            result = verify_job(store, job_id)
            assert result.ok, result
        finally:
            store.close()
        assert sorted(p.name for p in evidence.iterdir()) == ["copy.db"]
    finally:
        subprocess.run(["chattr", "-i", str(evidence)], check=True)


def test_sqlite_copy_with_its_wal_in_a_read_only_directory_says_what_to_do(
    tmp_path: Path,
) -> None:
    """With a -wal file beside the copy, its transactions count, so the copy is not opened as
    immutable; without a -shm file nor a writable directory SQLite cannot read it, and the
    error says how to make a copy that can be read."""
    live = open_store(f"sqlite:///{tmp_path / 'live.db'}")
    try:
        live.create_job(plan_name="open")  # the -wal file exists while the store is open
        evidence = tmp_path / "evidence"
        evidence.mkdir()
        for suffix in ("", "-wal"):
            (evidence / f"copy.db{suffix}").write_bytes(
                (tmp_path / f"live.db{suffix}").read_bytes()
            )
    finally:
        live.close()
    locked = subprocess.run(["chattr", "+i", str(evidence)], capture_output=True, check=False)
    if locked.returncode != 0:
        pytest.skip(f"cannot make a directory immutable here: {locked.stderr.decode().strip()}")
    try:
        with pytest.raises(StoreError) as caught:
            open_store(f"sqlite:///{evidence / 'copy.db'}", read_only=True)
        assert "wal_checkpoint(TRUNCATE)" in caught.value.hint
    finally:
        subprocess.run(["chattr", "-i", str(evidence)], check=True)


@pytest.fixture
def select_only_role(pg_schema: str) -> Iterator[str]:
    """A PostgreSQL role that may only read the tables of ``pg_schema``."""
    role = f"auditor_{uuid.uuid4().hex[:12]}"
    yield role
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_postgresql_role_with_select_rights_alone(pg_schema: str, select_only_role: str) -> None:
    url = with_schema(PG_URL, pg_schema)
    job_id = finished_job(url)
    role = select_only_role
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO "{role}"')
        admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{pg_schema}" TO "{role}"')
    auditor = with_schema(PG_URL.replace("root@", f"{role}@", 1), pg_schema)

    with pytest.raises(StoreError, match="permission denied"):
        open_store(auditor)  # opening to write migrates, which this role may not
    store = open_store(auditor, read_only=True)
    try:
        assert verify_job(store, job_id).ok
        assert [j.job_id for j in store.list_jobs()] == [job_id]
    finally:
        store.close()
    # the commands an auditor runs open the database this way
    verified = cli("verify", job_id, "--db", auditor, "--json")
    assert verified.returncode == 0, verified.stderr
    assert json_of(verified)["ok"] is True
    listed = cli("jobs", "list", "--db", auditor, "--json")
    assert [j["job_id"] for j in json_of(listed)] == [job_id]


def test_a_read_only_sqlite_copy_keeps_no_wal_or_shm_files(tmp_path: Path) -> None:
    """Reading a WAL database makes its -wal and -shm files; a read-only store removes the ones
    it made (a copy kept as evidence stays one file), also when the copy is truncated and the
    read fails — but not files a writer has open."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    finished_job(url)
    original = (tmp_path / "live.db").read_bytes()
    copy, cut = tmp_path / "copy.db", tmp_path / "cut.db"
    copy.write_bytes(original)
    cut.write_bytes(original[: len(original) // 3])

    def sidecars(path: Path) -> list[str]:
        return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(path.name + "-"))

    every = cli("verify", "--all", "--db", f"sqlite:///{copy}", "--json")
    assert every.returncode == 0 and json_of(every)["failed"] == 0
    assert cli("jobs", "list", "--db", f"sqlite:///{copy}").returncode == 0
    assert sidecars(copy) == []
    assert copy.read_bytes() == original  # nothing written

    broken = cli("verify", "--all", "--db", f"sqlite:///{cut}")
    assert broken.returncode == 3 and "malformed" in broken.stderr
    assert sidecars(cut) == []

    writer = open_store(f"sqlite:///{copy}")  # a writer with the database open: its files stay
    try:
        writer.list_jobs()
        assert sidecars(copy) == ["copy.db-shm", "copy.db-wal"]
        assert cli("verify", "--all", "--db", f"sqlite:///{copy}").returncode == 0
        assert sidecars(copy) == ["copy.db-shm", "copy.db-wal"]
        writer.create_job(plan_name="after", events=[NewEvent("job_created", {"input": {}})])
    finally:
        writer.close()
    reader = open_store(f"sqlite:///{copy}", read_only=True)
    try:
        assert reader.list_jobs()[0].plan_name == "after"
    finally:
        reader.close()
