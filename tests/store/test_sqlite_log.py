"""SQLite keeps a job's log as one range of the events table's rowid (seq = number << 32 +
version, migration 6): every read of a log is a search of that range, never a scan of the
table, and a row belongs to a log only when its job_id agrees with the range."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.core.canonical import canonical
from affidavit.core.errors import StoreError
from affidavit.core.ids import new_attempt_id, new_event_id
from affidavit.store import NewEvent, open_store
from affidavit.store import _sqlite_tx as backend
from affidavit.store.sqlite import MAX_VERSION, SqliteStore
from affidavit.verify import verify_job
from tests.store.test_store import chain_ok, make_job
from tests.verify.helpers import RawDb

# (statement, parameters) of every read of a job's log or head
_READS = [
    (backend.BY_RANGE.job_select + " WHERE j.job_id = ?", ("j",)),
    (backend.BY_RANGE.job_select + " ORDER BY j.created_at DESC LIMIT ?", (5,)),
    (backend.BY_RANGE.after + " LIMIT ?", ("j", 3, 10)),
    (backend.BY_RANGE.rows, ("j",)),
    (backend.BY_RANGE.events, ("j",)),
    (backend._GUARD, (3, 3, "j")),
    (backend._JOB_AND_HEAD, ("j",)),
    (backend._LAST_VERSION, ("j",)),
]


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    s = open_store(f"sqlite:///{tmp_path / 'affidavit.db'}")
    assert isinstance(s, SqliteStore)
    return s


@pytest.mark.parametrize(("statement", "params"), _READS)
def test_reads_search_the_range_and_never_scan_the_events(
    store: SqliteStore, statement: str, params: tuple[object, ...]
) -> None:
    plan = store._read_rows("EXPLAIN QUERY PLAN " + statement, params)
    steps = [str(row[-1]) for row in plan]
    on_events = [s for s in steps if " events" in s or s.startswith(("SCAN e", "SEARCH e"))]
    assert on_events, steps
    assert all("INTEGER PRIMARY KEY" in s for s in on_events), steps


def test_logs_are_ranges_of_seq(store: SqliteStore) -> None:
    jobs = [make_job(store) for _ in range(3)]
    for n, job_id in enumerate(reversed(jobs)):  # interleaved appends
        for k in range(3):
            store.append(job_id, [NewEvent("node_started", {"k": k, "n": n})], expected_version=k)
    raw = RawDb(store.url)
    rows = raw.rows("SELECT e.seq, j.number, e.version FROM events e JOIN jobs j USING (job_id)")
    assert len(rows) == 9 and all(seq == (n << 32) + v for seq, n, v in rows)
    assert len({n for _, n, _ in rows}) == 3
    for job_id in jobs:
        assert [e.version for e in store.list_events(job_id)] == [1, 2, 3]
        assert [e.version for e in store.list_events(job_id, after_version=1, limit=1)] == [2]
        assert store.list_events(job_id, after_version=2**62) == []  # no spill into the next
        assert store.get_job(job_id).version == 3 and chain_ok(store, job_id)


def test_a_row_whose_job_id_disagrees_with_its_range_is_in_no_log(store: SqliteStore) -> None:
    a, b = make_job(store), make_job(store)
    for job_id in (a, b):
        store.append(
            job_id, [NewEvent("node_started", {"i": i}) for i in range(3)], expected_version=0
        )
    RawDb(store.url).execute(
        "UPDATE events SET job_id = ? WHERE job_id = ? AND version = 3", (b, a)
    )
    assert [e.version for e in store.list_events(a)] == [1, 2]
    assert [e.version for e in store.list_events(b)] == [1, 2, 3]
    assert store.get_job(a).version == 2


def test_a_log_holds_at_most_2_to_the_32_events(store: SqliteStore) -> None:
    job_id = make_job(store)
    attempt = new_attempt_id()
    last = (new_event_id(), "node_started", canonical({}))
    RawDb(store.url).insert_event((job_id, MAX_VERSION, *last, "00" * 32))
    with pytest.raises(StoreError, match="at most 4,294,967,295 events"), store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=attempt, owner="t", expires_at=1.0)
        tx.append(
            job_id, encoded=[last], expected_version=MAX_VERSION, head=bytes(32), fence=attempt
        )
    assert [e.version for e in store.list_events(job_id)] == [MAX_VERSION]


def test_verification_sees_the_log_the_store_reads(tmp_path: Path) -> None:
    """A tamperer who moves an event to another job's id takes it out of the log: a gap."""
    from tests.store.test_read_only import finished_job

    url = f"sqlite:///{tmp_path / 'affidavit.db'}"
    job_id = finished_job(url)
    raw = RawDb(url)
    raw.execute(
        "UPDATE events SET job_id = 'elsewhere' WHERE job_id = ? AND version = 3", (job_id,)
    )
    store = open_store(url)
    try:
        result = verify_job(store, job_id)
        assert not result.ok and result.stored_chain.first_bad_version == 3
    finally:
        store.close()


def test_a_row_written_by_hand_at_a_position_of_a_log_is_named(store: SqliteStore) -> None:
    """An INSERT that leaves seq to SQLite takes the highest rowid + 1: the next position of
    the highest-numbered job. That job's next append says so instead of a bare conflict."""
    job_id = make_job(store)
    store.append(job_id, [NewEvent("node_started", {})], expected_version=0)
    RawDb(store.url).execute(
        "INSERT INTO events (job_id, version, event_id, type, payload, chain_hash) "
        "VALUES ('by-hand', 1, 'by-hand-1', 'node_started', X'7B7D', ?)",
        ("00" * 32,),
    )
    held = "the position of version 2 .* held by a row of job 'by-hand'"
    with pytest.raises(StoreError, match=held) as caught:
        store.append(job_id, [NewEvent("node_started", {})], expected_version=1)
    assert "seq = (jobs.number << 32) + version" in caught.value.hint
    # also when the row sits past the first statement of a long append
    events = [NewEvent("node_started", {"i": i}) for i in range(250)]
    RawDb(store.url).execute("UPDATE events SET seq = seq + 150 WHERE job_id = 'by-hand'")
    with pytest.raises(StoreError, match=held.replace("2", "152")):
        store.append(job_id, events, expected_version=1)
    assert [e.version for e in store.list_events(job_id)] == [1]
