"""Direct access to a SQLite store's file from the process that has the store open
(``connect_raw``, through the store's own driver), and lenient reads of text that is not UTF-8.

These are SQLite-only by nature: PostgreSQL has no file to open and refuses text that is not
valid in its encoding."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from affidavit.core.errors import ConflictError, StoreError
from affidavit.core.ids import new_attempt_id
from affidavit.store import NewEvent, open_store
from affidavit.store.sqlite import SqliteStore, TextNotUtf8, connect_raw, is_text_decode_error


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = open_store(f"sqlite:///{tmp_path / 'affidavit.db'}")
    assert isinstance(s, SqliteStore)
    yield s
    s.close()


def _job(store: SqliteStore, events: int = 2) -> str:
    job, _ = store.create_job(
        events=[NewEvent("job_created", {})]
        + [NewEvent("node_started", {"i": i}) for i in range(1, events)]
    )
    return job.job_id


def test_a_raw_edit_is_seen_by_the_open_store_and_its_next_writes(store: SqliteStore) -> None:
    """Edits through ``connect_raw`` while the store is open (its writer and a reader hold
    connections) are what the store's reads and writes see next. (With Python's ``sqlite3`` —
    another copy of SQLite — closing the raw connection checkpointed and deleted the WAL under
    the store's connections, whose writer then missed the edit.)"""
    job_id = _job(store)
    assert store.get_job(job_id).version == 2  # a reader connection is open now
    for version in (3, 4, 5):
        with connect_raw(store.path) as raw:
            (number,) = raw.execute(
                "SELECT number FROM jobs WHERE job_id = ?", (job_id,)
            ).fetchone()
            raw.execute(
                "INSERT INTO events (seq, job_id, version, event_id, type, payload, chain_hash) "
                "VALUES (?, ?, ?, ?, 'node_started', x'7b7d', ?)",
                ((number << 32) + version, job_id, version, f"by-hand-{version}", "00" * 32),
            )
        with pytest.raises(ConflictError), store.transaction() as tx:  # the writer sees the row
            tx.append(job_id, [NewEvent("node_started", {})], expected_version=version - 1)
        assert store.get_job(job_id).version == version
    assert [e.event_id for e in store.list_events(job_id)][2:] == [
        "by-hand-3",
        "by-hand-4",
        "by-hand-5",
    ]


def test_a_raw_connection_begins_commits_and_rolls_back_as_sqlite3_does(
    store: SqliteStore,
) -> None:
    job_id = _job(store)
    raw = connect_raw(store.path)
    try:
        assert raw.execute(
            "SELECT count(*) FROM events WHERE job_id = ?", (job_id,)
        ).fetchone() == (2,)
        assert not raw.conn.in_transaction  # a read begins nothing
        raw.execute("UPDATE jobs SET plan_name = 'x' WHERE job_id = ?", (job_id,))
        assert raw.conn.in_transaction  # a write begins a transaction ...
        raw.rollback()
        assert store.get_job(job_id).plan_name is None  # ... which a rollback undoes
        cur = raw.executemany(
            "UPDATE jobs SET plan_name = ? WHERE job_id = ?", [("a", job_id), ("b", "no-such")]
        )
        assert cur.rowcount == 1
        raw.commit()
        assert store.get_job(job_id).plan_name == "a"
    finally:
        raw.close()
    with pytest.raises(ZeroDivisionError), connect_raw(store.path) as raw:
        raw.execute("UPDATE jobs SET plan_name = 'lost' WHERE job_id = ?", (job_id,))
        raise ZeroDivisionError  # the block fails: nothing it wrote stays
    assert store.get_job(job_id).plan_name == "a"
    autocommit = connect_raw(store.path, autocommit=True)
    try:
        autocommit.execute("UPDATE jobs SET plan_name = 'b' WHERE job_id = ?", (job_id,))
        assert not autocommit.conn.in_transaction
    finally:
        autocommit.close()
    assert store.get_job(job_id).plan_name == "b"


def test_text_that_is_not_utf8_fails_a_strict_read_and_reads_leniently(store: SqliteStore) -> None:
    """A strict read of text that is not UTF-8 is a StoreError whose cause says so — not a
    ``ValueError`` on the way (code that catches malformed values must not take a failed read
    for one). A lenient snapshot reads every row, in order, each value of its own type, bad
    bytes as lone surrogates."""
    job_id = _job(store, 4)
    with connect_raw(store.path) as raw:
        raw.execute(
            "UPDATE events SET type = CAST(x'ff41' AS TEXT) WHERE job_id = ? AND version = 3",
            (job_id,),
        )
    assert not issubclass(TextNotUtf8, ValueError)
    with pytest.raises(StoreError) as strict, store.snapshot() as snap:
        list(snap.iter_event_rows(job_id))
    assert is_text_decode_error(strict.value)
    with pytest.raises(StoreError) as strict, store.snapshot() as snap:
        snap.query("SELECT type FROM events WHERE job_id = ? AND version = 3", (job_id,))
    assert is_text_decode_error(strict.value)
    with store.snapshot(lenient_text=True) as snap:
        rows = list(snap.iter_event_rows(job_id))
        typed = snap.query(
            "SELECT 1, 2.5, x'00ff', NULL, 'ok', CAST(x'ff' AS TEXT), version "
            "FROM events WHERE job_id = ? ORDER BY version DESC",
            (job_id,),
        )
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    assert [r[2] for r in rows] == ["job_created", "node_started", "\udcffA", "node_started"]
    assert all(type(r[3]) is bytes for r in rows)
    assert typed == [(1, 2.5, b"\x00\xff", None, "ok", "\udcff", v) for v in (4, 3, 2, 1)]


def test_a_write_transaction_that_meets_text_not_utf8_is_a_store_error(store: SqliteStore) -> None:
    """Inside a write transaction too, text that is not UTF-8 fails as a StoreError (rolled
    back), not as the driver's ``UnicodeDecodeError``."""
    job_id = _job(store)
    attempt = new_attempt_id()
    with store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=attempt, owner="w", expires_at=1.0)
    with connect_raw(store.path) as raw:
        raw.execute("UPDATE jobs SET attempt_id = CAST(x'ff' AS TEXT) WHERE job_id = ?", (job_id,))
    with pytest.raises(StoreError) as caught, store.transaction() as tx:
        tx.append(job_id, [NewEvent("node_started", {})], expected_version=2, fence=attempt)
    assert is_text_decode_error(caught.value)
    assert [e.version for e in store.list_events(job_id)] == [1, 2]


def test_a_raw_connection_to_a_path_that_cannot_be_opened_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "x.db"
    with pytest.raises(StoreError, match=r"cannot open SQLite database .*no-such-dir"):
        connect_raw(missing)
    assert not missing.parent.exists()


def test_the_driver_is_one_copy_of_sqlite_for_the_store_and_connect_raw(store: SqliteStore) -> None:
    """The store and ``connect_raw`` use the same SQLite library (apsw's)."""
    raw = connect_raw(store.path)
    try:
        (version,) = raw.execute("SELECT sqlite_version()").fetchone()
    finally:
        raw.close()
    assert version == apsw.sqlite_lib_version()
    assert isinstance(store._writer, apsw.Connection)
