"""Store.snapshot(): one consistent, read-only moment, streamed; on both backends."""

from __future__ import annotations

import pytest

from affidavit.core.errors import StoreError
from affidavit.core.seal import PublicKey
from affidavit.record._sealing import SigningKey
from affidavit.store import NewEvent, Store, postgres
from affidavit.store.sqlite import SqliteStore, connect_raw


def make_job(store: Store, n: int) -> str:
    job, _ = store.create_job(
        events=[NewEvent("node_started", {"node_id": f"n{i}"}) for i in range(n)]
    )
    return job.job_id


def test_snapshot_does_not_see_later_commits(store: Store) -> None:
    job_id = make_job(store, 3)
    with store.snapshot() as snap:
        job = snap.get_job(job_id)
        assert job is not None and job.version == 3
        store.append(job_id, [NewEvent("node_started", {"node_id": "late"})], expected_version=3)
        with store.transaction() as tx:
            tx.ledger_insert(
                job_id=job_id,
                key="k",
                node_id="n0",
                step_id="s",
                tool_name="t",
                args_hash="a",
                invocation_id="i",
                attempt_id=None,
            )
        assert [v for v, *_ in snap.iter_event_rows(job_id)] == [1, 2, 3]
        assert snap.ledger_list(job_id) == []
    with store.snapshot() as snap:
        assert len(list(snap.iter_events(job_id))) == 4
        [row] = snap.ledger_list(job_id)
        assert row.idempotency_key == "k"


def test_a_read_during_an_unfinished_stream(store: Store) -> None:
    """SQLite reads beside an unfinished stream. A PostgreSQL connection carries one statement
    at a time (its streams arrive in chunks, not through a server-side cursor): a read begun
    before the stream ended is refused at once — it would otherwise wait forever for the
    connection — and the snapshot still ends cleanly."""
    job_id = make_job(store, 30)
    with store.snapshot() as snap:
        rows = iter(snap.iter_event_rows(job_id, batch=4))
        assert next(rows)[0] == 1
        if isinstance(store, SqliteStore):
            assert snap.get_job(job_id).version == 30  # type: ignore[union-attr]
            assert [r[0] for r in rows] == list(range(2, 31))
        else:
            with pytest.raises(StoreError, match="stream was read to its end"):
                snap.get_job(job_id)
            with pytest.raises(StoreError, match="stream was read to its end"):
                next(iter(snap.iter_ledger_columns(job_id)))
            assert [r[0] for r in rows] == list(range(2, 31))  # the stream goes on
            assert snap.get_job(job_id).version == 30  # type: ignore[union-attr]
    with store.snapshot() as snap:
        assert snap.get_job(job_id).version == 30  # type: ignore[union-attr]


def test_streams_without_chunked_rows(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a libpq older than 17 (no chunked rows), PostgreSQL snapshots stream through
    server-side cursors: the same rows, and reads beside an unfinished stream work."""
    job_id = make_job(store, 30)
    with store.snapshot() as snap:
        chunked = list(snap.iter_event_rows(job_id, batch=4))
    monkeypatch.setattr(postgres, "CHUNKED_ROWS", False)
    with store.snapshot() as snap:
        rows = iter(snap.iter_event_rows(job_id, batch=4))
        first = next(rows)
        assert snap.get_job(job_id).version == 30  # type: ignore[union-attr]
        assert [first, *rows] == chunked
        assert [r[0] for r in chunked] == list(range(1, 31))


def test_snapshot_streams_in_batches_in_version_order(store: Store) -> None:
    job_id = make_job(store, 25)
    other = make_job(store, 2)
    stored = store.list_events(job_id)
    with store.snapshot() as snap:
        streamed = list(snap.iter_events(job_id, batch=4))
        rows = list(snap.iter_event_rows(job_id, batch=7))
        assert snap.get_job("missing") is None
    assert [(e.event_id, e.payload_bytes, e.chain_hash) for e in streamed] == [
        (e.event_id, e.payload_bytes, e.chain_hash) for e in stored
    ]
    assert [(v, i, t, bytes(p), h) for v, i, t, p, h in rows] == [
        (e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash) for e in stored
    ]
    assert other not in {e.job_id for e in streamed}


def test_snapshot_is_read_only(store: Store) -> None:
    job_id = make_job(store, 1)
    with pytest.raises(StoreError), store.snapshot() as snap:
        snap.query("UPDATE jobs SET status = 'failed' WHERE job_id = ?", (job_id,))  # type: ignore[attr-defined]
    assert store.get_job(job_id).status == "pending"


def test_seals_and_keys_round_trip(store: Store) -> None:
    job_id = make_job(store, 2)
    key = SigningKey.generate()
    head = store.get_job(job_id)
    seal = key.seal(job_id, head.version, head.head_hash or "")
    with store.transaction() as tx:
        tx.key_register(key.public, created_at="2026-01-01T00:00:00.000000Z")
        tx.key_register(key.public, created_at="later")  # already known: left as it is
        tx.seal_insert(seal)
        tx.seal_insert(key.seal(job_id, 99, "x"))  # one seal per job: the first is kept
    assert store.get_seal(job_id) == seal
    [recorded] = store.signing_keys()
    assert recorded == PublicKey(
        key.key_id, key.public_raw, created_at="2026-01-01T00:00:00.000000Z", retired_at=None
    )
    with store.transaction() as tx:
        tx.key_retire(key.key_id, retired_at="2026-02-01T00:00:00.000000Z")
    assert store.signing_keys()[0].retired_at == "2026-02-01T00:00:00.000000Z"
    with store.snapshot() as snap:
        assert snap.seal_get(job_id) == seal and snap.keys_list() == store.signing_keys()


def test_a_seals_log_leaf_is_queued_only_if_that_seal_is_the_one_stored(store: Store) -> None:
    """``seal_insert(..., leaf=)`` queues the leaf in the seal's transaction when the seal is
    stored, and queues nothing when the job already had a seal (which it keeps)."""
    job_id = make_job(store, 2)
    key = SigningKey.generate()
    first, second = key.seal(job_id, 2, "a"), key.seal(job_id, 2, "b")
    with store.transaction() as tx:
        tx.seal_insert(first, leaf=b"leaf-1", queued_at=1.0)
    with store.transaction() as tx:
        tx.seal_insert(second, leaf=b"leaf-2", queued_at=2.0)
        queued = tx.tlog_queue_batch(10)
    assert store.get_seal(job_id) == first
    assert [(q.job_id, q.leaf, q.queued_at) for q in queued] == [(job_id, b"leaf-1", 1.0)]


def test_each_snapshot_begins_anew_whatever_the_one_before_did(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snapshots one after another (SQLite keeps the connection of one that ended for the
    next): each sees what was committed before it began — also after a snapshot that raised,
    or that stopped reading a stream half-way — and none is left open."""
    job_id = make_job(store, 30)
    opened = []
    if isinstance(store, SqliteStore):
        connect = store._connect
        monkeypatch.setattr(store, "_connect", lambda: opened.append(1) or connect())
    with store.snapshot() as snap:
        assert snap.get_job(job_id).version == 30  # type: ignore[union-attr]
    with pytest.raises(ValueError), store.snapshot() as snap:
        raise ValueError("the caller's own error")
    store.append(job_id, [NewEvent("node_started", {"node_id": "x"})], expected_version=30)
    with store.snapshot() as snap:
        rows = snap.iter_event_rows(job_id, batch=4)
        assert next(iter(rows))[0] == 1  # one row of 31 read, the stream left open
    store.append(job_id, [NewEvent("node_started", {"node_id": "y"})], expected_version=31)
    with store.snapshot() as snap:
        assert [v for v, *_ in snap.iter_event_rows(job_id)] == list(range(1, 33))
    if isinstance(store, SqliteStore):
        assert len(opened) == 1  # the first snapshot's connection served the rest
        store.close()
        assert store._idle_snapshots == []  # closed with the store
        with pytest.raises(StoreError, match="closed"), store.snapshot():
            pass


def test_a_lenient_snapshot_leaves_the_next_one_strict(store_url: str, store: Store) -> None:
    """``lenient_text`` holds for that snapshot only, not for the next one on its connection."""
    if not isinstance(store, SqliteStore):
        pytest.skip("PostgreSQL refuses text that is not UTF-8, so no row can hold it")
    job_id = make_job(store, 2)
    with connect_raw(store.path) as raw:
        raw.execute("UPDATE events SET type = CAST(x'ff41' AS TEXT) WHERE job_id = ?", (job_id,))
    with store.snapshot(lenient_text=True) as snap:
        assert [t for _, _, t, _, _ in snap.iter_event_rows(job_id)] == ["\udcffA"] * 2
    with pytest.raises(StoreError), store.snapshot() as snap:
        list(snap.iter_event_rows(job_id))
