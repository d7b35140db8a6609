"""The Store contract, run against SQLite and PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import Any

import apsw
import pytest

from affidavit.core.canonical import canonical
from affidavit.core.chain import chain_root, check_stored_chain
from affidavit.core.errors import (
    CanonicalizationError,
    ConfigError,
    ConflictError,
    FencedError,
    InvalidEventError,
    JobNotFound,
    StoreError,
    UnsupportedDatabaseURL,
)
from affidavit.core.ids import new_attempt_id
from affidavit.store import (
    Claimed,
    JobFilter,
    NewEvent,
    NextClaim,
    Store,
    migrations,
    open_store,
)
from tests.verify.helpers import RawDb


def ev(n: int, **extra: Any) -> NewEvent:
    return NewEvent("node_started", {"n": n, "text": "é€😀", **extra})


def make_job(store: Store, **kw: Any) -> str:
    job, created = store.create_job(**kw)
    assert created
    return job.job_id


def chain_ok(store: Store, job_id: str) -> bool:
    events = store.list_events(job_id)
    check = check_stored_chain(
        (e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash) for e in events
    )
    return check.ok and check.root == store.get_job(job_id).head_hash


def test_append_chains_and_lists(store: Store) -> None:
    job_id = make_job(store, plan_name="p")
    first = store.append(job_id, [ev(1)], expected_version=0)
    more = store.append(
        job_id, [ev(2), ev(3, nested={"b": 1, "a": [1.5, None]})], expected_version=1
    )
    assert [e.version for e in first + more] == [1, 2, 3]
    events = store.list_events(job_id)
    assert [e.version for e in events] == [1, 2, 3]
    assert events[2].payload_bytes == canonical(
        {"n": 3, "text": "é€😀", "nested": {"a": [1.5, None], "b": 1}}
    )
    assert events[2].payload == {"n": 3, "text": "é€😀", "nested": {"a": [1.5, None], "b": 1}}
    assert [e.chain_hash for e in events] == [e.chain_hash for e in first + more]
    assert (
        chain_root((e.event_id, e.type, e.payload_bytes) for e in events) == events[-1].chain_hash
    )
    job = store.get_job(job_id)
    assert job.version == 3
    assert job.head_hash == events[-1].chain_hash
    assert chain_ok(store, job_id)
    assert [e.version for e in store.list_events(job_id, after_version=1)] == [2, 3]
    assert [e.version for e in store.list_events(job_id, after_version=1, limit=1)] == [2]
    assert [e.version for e in store.iter_events(job_id, batch=2)] == [1, 2, 3]
    # a window of the log, paged: what list_events returns for it
    for after, limit in ((0, None), (1, None), (0, 2), (1, 2), (1, 1), (3, None), (0, 5)):
        paged = store.iter_events(job_id, batch=1, after_version=after, limit=limit)
        whole = store.list_events(job_id, after_version=after, limit=limit)
        assert [e.version for e in paged] == [e.version for e in whole], (after, limit)
    assert events[0].to_dict()["payload"] == {"n": 1, "text": "é€😀"}


def test_version_conflict_writes_nothing(store: Store) -> None:
    job_id = make_job(store)
    store.append(job_id, [ev(1), ev(2)], expected_version=0)
    for wrong in (0, 1, 3):
        with pytest.raises(ConflictError) as info:
            store.append(job_id, [ev(9)], expected_version=wrong)
        assert info.value.actual == 2
        assert info.value.expected == wrong
    assert len(store.list_events(job_id)) == 2


def test_fencing_rejects_a_stale_attempt(store: Store) -> None:
    job_id = make_job(store)
    old, new = new_attempt_id(), new_attempt_id()
    with store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=old, owner="w1", expires_at=1.0)
    store.append(job_id, [ev(1)], expected_version=0, fence=old)
    with store.transaction() as tx:  # the lease moves to a new attempt (reclaim)
        tx.set_lease(job_id, attempt_id=new, owner="w2", expires_at=2.0)
    with pytest.raises(FencedError) as info:
        store.append(job_id, [ev(2)], expected_version=1, fence=old)
    assert info.value.current == new
    with pytest.raises(FencedError), store.transaction() as tx:
        tx.update_job(job_id, status="completed", fence=old)
    assert store.get_job(job_id).status == "pending"
    store.append(job_id, [ev(2)], expected_version=1, fence=new)
    job = store.get_job(job_id)
    assert (job.version, job.attempt_id, job.lease_owner, job.lease_expires_at) == (
        2,
        new,
        "w2",
        2.0,
    )


def _encoded(*numbers: int) -> list[tuple[str, str, bytes]]:
    return [
        (f"known-head-{n}-{new_attempt_id()}", "node_started", canonical({"n": n})) for n in numbers
    ]


def test_append_after_a_known_head(store: Store) -> None:
    """A writer that holds the head chains from it; the log is the same as with a read head,
    and an append at a version the log has moved past is refused with nothing written."""
    job_id = make_job(store)
    attempt = new_attempt_id()
    with store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=attempt, owner="w", expires_at=1.0)
        first = tx.append(
            job_id, encoded=_encoded(1, 2), expected_version=0, head=b"", fence=attempt
        )
    head = bytes.fromhex(first[-1].chain_hash)
    with store.transaction() as tx:
        more = tx.append(job_id, encoded=_encoded(3), expected_version=2, head=head, fence=attempt)
    assert [e.version for e in first + more] == [1, 2, 3]
    assert chain_ok(store, job_id)
    # someone else appended meanwhile: a writer still holding version 3's head is refused
    store.append(job_id, [ev(4)], expected_version=3)
    stale = bytes.fromhex(more[-1].chain_hash)
    with pytest.raises(ConflictError) as info, store.transaction() as tx:
        tx.append(job_id, encoded=_encoded(9), expected_version=3, head=stale, fence=attempt)
    assert (info.value.expected, info.value.actual) == (3, 4)
    with pytest.raises(FencedError), store.transaction() as tx:
        tx.append(job_id, encoded=_encoded(9), expected_version=4, head=stale, fence="other")
    with pytest.raises(JobNotFound), store.transaction() as tx:
        tx.append("nope", encoded=_encoded(9), expected_version=0, head=b"")
    # a writer that believes the log longer than it is: refused too, never a gap
    latest = bytes.fromhex(store.list_events(job_id)[-1].chain_hash)
    for ahead in (5, 9):
        with pytest.raises(ConflictError) as info, store.transaction() as tx:
            tx.append(
                job_id, encoded=_encoded(9, 10), expected_version=ahead, head=latest, fence=attempt
            )
        assert (info.value.expected, info.value.actual) == (ahead, 4)
    assert store.get_job(job_id).version == 4
    assert [e.version for e in store.list_events(job_id)] == [1, 2, 3, 4]
    assert chain_ok(store, job_id)


def test_append_returning_hashes_writes_the_same_and_refuses_the_same(
    store: Store,
) -> None:
    """``append(..., head=..., hashes=True)`` (a run's appends) writes what the append without
    ``hashes`` writes and returns the new events' raw chain hashes; it is refused in the same
    cases (fenced, a log that moved, an unknown job), nothing written; no events return none."""
    job_id = make_job(store)
    attempt = new_attempt_id()
    with store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=attempt, owner="w", expires_at=1.0)
    head = b""  # (an empty log)
    for count in (1, 3, 2):
        version = store.get_job(job_id).version
        with store.transaction() as tx:
            hashes = tx.append(
                job_id,
                encoded=_encoded(*range(count)),
                expected_version=version,
                fence=attempt,
                head=head,
                hashes=True,
            )
        events = store.list_events(job_id)
        assert len(events) == version + count
        assert hashes == [bytes.fromhex(e.chain_hash) for e in events[version:]]
        assert hashes[-1] != head
        head = hashes[-1]
    assert chain_ok(store, job_id)
    version = store.get_job(job_id).version
    with store.transaction() as tx:
        assert (
            tx.append(
                job_id, encoded=[], expected_version=version, fence=attempt, head=head, hashes=True
            )
            == []
        )
    refusals: list[tuple[type[Exception], dict[str, Any]]] = [
        (FencedError, {"expected_version": version, "fence": "another", "head": head}),
        (ConflictError, {"expected_version": version - 1, "fence": attempt, "head": head}),
        (ConflictError, {"expected_version": version + 1, "fence": attempt, "head": head}),
    ]
    for error, kw in refusals:
        with pytest.raises(error), store.transaction() as tx:
            tx.append(job_id, encoded=_encoded(7), **kw, hashes=True)
    with pytest.raises(JobNotFound), store.transaction() as tx:
        tx.append(
            "no-such-job",
            encoded=_encoded(7),
            expected_version=0,
            fence=None,
            head=b"",
            hashes=True,
        )
    assert store.get_job(job_id).version == version


def test_one_append_takes_events_or_encoded_rows_in_or_out_of_a_transaction(
    store: Store,
) -> None:
    """``Store.append`` and ``Transaction.append`` are one append: events or pre-encoded rows,
    with or without a known head, events or hashes back, the same chain; both kinds at once are
    refused before anything is written."""
    job_id = make_job(store)
    first = store.append(job_id, [NewEvent("node_started", {"n": 0})], expected_version=0)
    head = bytes.fromhex(first[-1].chain_hash)
    more = store.append(job_id, encoded=_encoded(1), expected_version=1, head=head)
    assert [e.version for e in more] == [2]
    with store.transaction() as tx:
        hashes = tx.append(job_id, encoded=_encoded(2, 3), expected_version=2, hashes=True)
    events = store.list_events(job_id)
    assert hashes == [bytes.fromhex(e.chain_hash) for e in events[2:]]
    assert [json.loads(e.payload_bytes)["n"] for e in events] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not both"):
        store.append(
            job_id, [NewEvent("node_started", {})], encoded=_encoded(9), expected_version=4
        )
    with pytest.raises(ValueError), store.transaction() as tx:
        tx.append(job_id, [NewEvent("node_started", {})], encoded=_encoded(9), expected_version=4)
    assert store.get_job(job_id).version == 4
    assert chain_ok(store, job_id)


def test_long_append_after_a_known_head_is_all_or_nothing(store: Store) -> None:
    """An append of more events than one statement takes (SQLite writes 100 rows per
    statement) is written whole, in version order, or not at all — also when the caller keeps
    the transaction going after the error."""
    job_id = make_job(store)
    attempt = new_attempt_id()
    with store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=attempt, owner="w", expires_at=1.0)
        first = tx.append(
            job_id, encoded=_encoded(*range(1, 251)), expected_version=0, head=b"", fence=attempt
        )
    assert [e.version for e in store.list_events(job_id)] == list(range(1, 251))
    assert [e.event_id for e in store.list_events(job_id)] == [e.event_id for e in first]
    assert chain_ok(store, job_id)
    head = bytes.fromhex(first[-1].chain_hash)
    # the last of 250 new events reuses an id the log holds: nothing of the append is written
    reused = [*_encoded(*range(251, 500)), (first[0].event_id, "node_started", b"{}")]
    with pytest.raises(StoreError), store.transaction() as tx:
        tx.append(job_id, encoded=reused, expected_version=250, head=head, fence=attempt)
    assert store.get_job(job_id).version == 250
    if store.backend == "sqlite":  # (a failed statement ends a PostgreSQL transaction)
        with store.transaction() as tx:
            with pytest.raises(apsw.ConstraintError):
                tx.append(job_id, encoded=reused, expected_version=250, head=head, fence=attempt)
            tx.append(job_id, encoded=_encoded(251), expected_version=250, head=head, fence=attempt)
        assert [e.version for e in store.list_events(job_id)] == list(range(1, 252))
        assert chain_ok(store, job_id)


def test_unknown_job(store: Store) -> None:
    with pytest.raises(JobNotFound):
        store.append("nope", [ev(1)], expected_version=0)
    with pytest.raises(JobNotFound):
        store.get_job("nope")
    assert store.list_events("nope") == []


def test_bad_payload_writes_nothing(store: Store) -> None:
    job_id = make_job(store)
    with pytest.raises(CanonicalizationError, match=r"\$\.deep\[1\]"):
        store.append(
            job_id, [ev(1), NewEvent("node_started", {"deep": [1, 2**60]})], expected_version=0
        )
    with pytest.raises(InvalidEventError):
        store.append(job_id, [NewEvent("has space", {})], expected_version=0)
    with pytest.raises(InvalidEventError):
        store.append(job_id, [NewEvent("node_started", {}, event_id="a b")], expected_version=0)
    # the chain separates id and type with a space and events with a newline: a trailing
    # newline (which a regex's `$` lets through) would make two logs hash alike
    with pytest.raises(InvalidEventError):
        store.append(job_id, [NewEvent("node_started\n", {})], expected_version=0)
    with pytest.raises(InvalidEventError):
        store.append(job_id, [NewEvent("node_started", {}, event_id="e1\n")], expected_version=0)
    assert store.list_events(job_id) == []
    assert store.get_job(job_id).version == 0


def test_transaction_rolls_back_everything_on_error(store: Store) -> None:
    job_id = make_job(store)
    with pytest.raises(RuntimeError), store.transaction() as tx:
        tx.append(job_id, [ev(1)], expected_version=0)
        tx.update_job(job_id, status="running")
        tx.create_job(job_id="other")
        raise RuntimeError("boom")
    assert store.list_events(job_id) == []
    assert store.get_job(job_id).status == "pending"
    with pytest.raises(JobNotFound):
        store.get_job("other")


def test_events_and_job_rows_commit_together(store: Store) -> None:
    with store.transaction(durable=False) as tx:
        job, created = tx.create_job(plan_name="p", submitted_by="alice")
        assert created
        tx.append(job.job_id, [ev(1), ev(2)], expected_version=0)
        tx.update_job(job.job_id, status="completed", output={"r": 1})
    got = store.get_job(job.job_id)
    assert (got.status, got.output, got.version, got.submitted_by) == (
        "completed",
        {"r": 1},
        2,
        "alice",
    )
    assert got.terminal
    assert chain_ok(store, job.job_id)


def test_duplicate_event_id_is_rejected(store: Store) -> None:
    a, b = make_job(store), make_job(store)
    store.append(a, [NewEvent("node_started", {}, event_id="same-id")], expected_version=0)
    with pytest.raises(StoreError):
        store.append(b, [NewEvent("node_started", {}, event_id="same-id")], expected_version=0)
    assert store.get_job(b).version == 0


def test_create_job_idempotency_key(store: Store) -> None:
    first, created = store.create_job(
        idempotency_key="order-7",
        plan_name="refund",
        events=[NewEvent("job_created", {"input": {"order": 7}})],
    )
    assert created and first.version == 1
    again, created_again = store.create_job(
        idempotency_key="order-7", events=[NewEvent("job_created", {"input": {"order": 8}})]
    )
    assert not created_again
    assert again.job_id == first.job_id
    assert [e.payload for e in store.list_events(first.job_id)] == [{"input": {"order": 7}}]
    other_ns, created_ns = store.create_job(idempotency_key="order-7", namespace="team-b")
    assert created_ns and other_ns.job_id != first.job_id
    # jobs without a key never collide
    assert store.create_job()[0].job_id != store.create_job()[0].job_id


def test_explicit_job_id_collision(store: Store) -> None:
    store.create_job(job_id="fixed")
    with pytest.raises(StoreError, match="already exists"):
        store.create_job(job_id="fixed")


def test_list_jobs_filters(store: Store) -> None:
    ids = [
        make_job(store, namespace="a" if i % 2 else "b", plan_name=f"p{i % 3}") for i in range(9)
    ]
    with store.transaction() as tx:
        tx.update_job(ids[0], status="completed")
        tx.update_job(ids[1], status="failed", error={"message": "x"})
    assert len(store.list_jobs()) == 9
    assert [j.job_id for j in store.list_jobs(JobFilter(limit=3))] == ids[::-1][:3]
    assert [j.job_id for j in store.list_jobs(JobFilter(limit=3, offset=3))] == ids[::-1][3:6]
    assert {j.job_id for j in store.list_jobs(JobFilter(status=["completed", "failed"]))} == set(
        ids[:2]
    )
    assert all(j.namespace == "a" for j in store.list_jobs(JobFilter(namespace="a")))
    assert len(store.list_jobs(JobFilter(namespace="a"))) == 4
    assert len(store.list_jobs(JobFilter(plan_name="p0", namespace="b"))) == 2  # i = 0, 6
    assert store.get_job(ids[1]).error == {"message": "x"}
    with pytest.raises(ConfigError):
        store.list_jobs(JobFilter(status=["sleeping"]))
    with pytest.raises(ConfigError):
        store.list_jobs(JobFilter(limit=0))
    # a snapshot lists the same ids in the same order, reading only the ids
    for filters in (
        JobFilter(),
        JobFilter(limit=3, offset=3),
        JobFilter(status=["completed", "failed"]),
        JobFilter(plan_name="p0", namespace="b"),
    ):
        with store.snapshot() as snap:
            listed = snap.list_job_ids(filters)
        assert listed == [j.job_id for j in store.list_jobs(filters)]
    with store.snapshot() as snap, pytest.raises(ConfigError):
        snap.list_job_ids(JobFilter(status=["sleeping"]))


def test_list_jobs_pages_by_cursor(store: Store) -> None:
    ids = [make_job(store, namespace="a" if i % 2 else "b") for i in range(8)]
    with store.transaction() as tx:
        tx.update_job(ids[0], status="completed")
        # four jobs created in the same millisecond: only the job id orders them
        tx.execute(
            "UPDATE jobs SET created_at = ? WHERE job_id IN (?, ?, ?, ?)",
            ("2026-01-01T00:00:00.000Z", *ids[2:6]),
        )
    for filters in (
        JobFilter(limit=3),
        JobFilter(limit=1),
        JobFilter(limit=2, namespace="a"),
        JobFilter(limit=2, status=["pending"]),
        JobFilter(limit=2, status=["completed", "pending"]),
    ):
        expected = [j.job_id for j in store.list_jobs(replace(filters, limit=100))]
        assert len(expected) >= 3
        paged: list[str] = []
        before: str | None = None
        while page := store.list_jobs(replace(filters, before=before)):
            assert len(page) <= filters.limit
            paged += [j.job_id for j in page]
            before = page[-1].job_id
        assert paged == expected, filters
        with store.snapshot() as snap:  # a snapshot's id listing takes the cursor too
            assert (
                snap.list_job_ids(replace(filters, before=expected[0]))
                == expected[1:][: filters.limit]
            )
    everything = [j.job_id for j in store.list_jobs(JobFilter(limit=100))]
    # a cursor stays put while new jobs arrive (an offset would shift by one per new job)
    second_page = store.list_jobs(JobFilter(limit=3, before=everything[2]))
    make_job(store)
    assert store.list_jobs(JobFilter(limit=3, before=everything[2])) == second_page
    assert [j.job_id for j in second_page] == everything[3:6]
    # with an offset: skip that many after the cursor
    skipped = store.list_jobs(JobFilter(limit=2, offset=2, before=everything[0]))
    assert [j.job_id for j in skipped] == everything[3:5]
    # the last job as the cursor: an empty page; a cursor naming no job: an error
    assert store.list_jobs(JobFilter(before=everything[-1])) == []
    with pytest.raises(JobNotFound):
        store.list_jobs(JobFilter(before="no-such-job"))
    with pytest.raises(ConfigError):
        store.list_jobs(JobFilter(before="bad\x00id"))


def test_migrations_are_idempotent(empty_store_url: str) -> None:
    first = open_store(empty_store_url, migrate=False)
    try:
        known = [
            m.version
            for m in migrations.load("sqlite" if first.backend == "sqlite" else "postgres")
        ]
        assert known[:2] == [1, 2]
        assert first.schema_version() == 0
        assert first.migrate() == known
        assert first.migrate() == []
        assert first.schema_version() == known[-1]
    finally:
        first.close()
    second = open_store(empty_store_url)  # migrate on open: nothing left to do, data intact
    try:
        assert second.migrate() == []
        assert second.schema_version() == known[-1]
    finally:
        second.close()


def test_newer_schema_is_refused(store_url: str) -> None:
    s = open_store(store_url)
    try:
        with s.transaction() as tx:
            tx.execute(  # simulate a database migrated by a newer affidavit
                "INSERT INTO affidavit_schema_migrations (version, name, applied_at) "
                "VALUES (99, 'future', 'x')"
            )
    finally:
        s.close()
    with pytest.raises(StoreError, match="newer than this affidavit"):
        open_store(store_url)


def test_durable_and_non_durable_commits_are_both_visible(store: Store) -> None:
    job_id = make_job(store)
    store.append(job_id, [ev(1)], expected_version=0, durable=False)
    store.append(job_id, [ev(2)], expected_version=1, durable=True)
    store.append(job_id, [ev(3)], expected_version=2, durable=False)
    assert [e.version for e in store.list_events(job_id)] == [1, 2, 3]
    assert chain_ok(store, job_id)


def test_payload_bytes_survive_a_reopen(store_url: str) -> None:
    s = open_store(store_url)
    job_id = make_job(s)
    payload = {"z": '\u2028\u0007"\\', "a": [1e21, 1e-7, -0.5, 12345678901234]}
    stored = s.append(job_id, [NewEvent("node_started", payload)], expected_version=0)
    s.close()
    s = open_store(store_url)
    try:
        (got,) = s.list_events(job_id)
        assert got.payload_bytes == stored[0].payload_bytes == canonical(payload)
        assert got.chain_hash == stored[0].chain_hash
        assert json.loads(got.payload_bytes)["a"][0] == 1e21
    finally:
        s.close()


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root@localhost/test",
        "sqlite://relative.db",
        "sqlite:///",
        "sqlite:///:memory:",
        "affidavit.db",
    ],
)
def test_unsupported_urls(url: str) -> None:
    with pytest.raises(UnsupportedDatabaseURL) as info:
        open_store(url)
    assert "sqlite:///" in info.value.message + info.value.hint


def test_sqlite_missing_directory(tmp_path: Any) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/no/such/dir/x.db")


def test_appends_by_another_store_are_never_overwritten(store: Store, store_url: str) -> None:
    """Another process's appends make this store's knowledge of the head stale: an append that
    expects the old version is refused, and the next one, at the right version, chains on the
    other process's head."""
    job_id = make_job(store)
    store.append(job_id, [ev(1)], expected_version=0)
    other = open_store(store_url)
    try:
        other.append(job_id, [ev(2)], expected_version=1)
    finally:
        other.close()
    with pytest.raises(ConflictError) as info:
        store.append(job_id, [ev(3)], expected_version=1)
    assert info.value.actual == 2
    store.append(job_id, [ev(3)], expected_version=2)
    assert [e.payload["n"] for e in store.list_events(job_id)] == [1, 2, 3]
    assert chain_ok(store, job_id)


def test_conflict_inside_a_transaction_rolls_back_its_other_writes(store: Store) -> None:
    job_id = make_job(store)
    store.append(job_id, [ev(1)], expected_version=0)
    with pytest.raises(ConflictError), store.transaction() as tx:
        tx.update_job(job_id, status="running")
        tx.append(job_id, [ev(2)], expected_version=0)  # stale
    assert store.get_job(job_id).status == "pending"
    assert len(store.list_events(job_id)) == 1
    store.append(job_id, [ev(2)], expected_version=1)
    assert chain_ok(store, job_id)


def test_ledger_insert_is_won_by_one_caller_only(store: Store) -> None:
    job, _ = store.create_job(events=[NewEvent("job_created", {})])
    row = {
        "job_id": job.job_id,
        "key": "k",
        "node_id": "n",
        "step_id": "s",
        "tool_name": "t",
        "args_hash": "a",
        "attempt_id": None,
    }
    with store.transaction() as tx:
        assert tx.ledger_insert(**row, invocation_id="first") is True
    with store.transaction() as tx:
        assert tx.ledger_insert(**row, invocation_id="second") is False
        assert tx.ledger_insert(**{**row, "key": "other"}, invocation_id="third") is True
    with store.transaction() as tx:
        first = tx.ledger_get(job.job_id, "k")
        assert first is not None and first.invocation_id == "first"


def test_t1_ledger_insert_then_append_reads_the_job_as_it_is(store: Store) -> None:
    """T1 of a tool step — a ledger insert, then the started events — is fenced and
    version-checked against the job as it is when the append runs: PostgreSQL sends the job's
    lock and head read with the insert, and whatever runs in between (a lease moved, an
    append) is seen by the append, never the values read with the insert."""
    job, _ = store.create_job(events=[NewEvent("job_created", {})])
    job_id, mine, theirs = job.job_id, new_attempt_id(), new_attempt_id()
    with store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=mine, owner="w", expires_at=1.0)

    def insert(tx: Any, key: str) -> bool:
        return tx.ledger_insert(
            job_id=job_id,
            key=key,
            node_id="n",
            step_id="s",
            tool_name="t",
            args_hash="a",
            invocation_id=f"inv-{key}",
            attempt_id=mine,
        )

    head = bytes.fromhex(store.list_events(job_id)[-1].chain_hash)
    with store.transaction() as tx:  # the usual T1
        assert insert(tx, "k1") is True
        started = tx.append(
            job_id, encoded=_encoded(2, 3), expected_version=1, head=head, fence=mine
        )
        # a second append in the same transaction reads the head the first one left
        more = tx.append(job_id, encoded=_encoded(4), expected_version=3, fence=mine)
    assert [e.version for e in started + more] == [2, 3, 4]
    head = bytes.fromhex(more[-1].chain_hash)
    # the lease moves between the insert and the append: the append is fenced, nothing stays
    with pytest.raises(FencedError), store.transaction() as tx:
        assert insert(tx, "k2") is True
        tx.set_lease(job_id, attempt_id=theirs, owner="w2", expires_at=2.0)
        tx.append(job_id, encoded=_encoded(5), expected_version=4, head=head, fence=mine)
    assert store.get_job(job_id).version == 4
    # the log moves between the insert and the append: a conflict, nothing stays
    with store.transaction() as tx:
        tx.set_lease(job_id, attempt_id=mine, owner="w", expires_at=3.0)
    with pytest.raises(ConflictError), store.transaction() as tx:
        assert insert(tx, "k2") is True
        tx.append(job_id, encoded=_encoded(5), expected_version=4, head=head, fence=mine)
        tx.append(job_id, encoded=_encoded(6), expected_version=4, head=head, fence=mine)
    with store.transaction() as tx:  # (both rolled back: the key is free, the log at 4)
        assert tx.ledger_get(job_id, "k2") is None
        assert insert(tx, "k1") is False  # a key already won: read it, then append
        assert tx.ledger_get(job_id, "k1") is not None
        tx.append(job_id, encoded=_encoded(5), expected_version=4, head=head, fence=mine)
    assert store.get_job(job_id).version == 5
    assert chain_ok(store, job_id)


def test_a_locked_read_sees_what_the_lock_holder_committed(store_url: str, store: Store) -> None:
    """``get_job(for_update=True)`` waits for a writer holding the job, then reads the row as
    that writer committed it (PostgreSQL sends the lock and the read together: the read is a
    statement of its own, after the lock)."""
    job_id = make_job(store)
    raw = RawDb(store_url)
    seen: list[str] = []

    def read() -> None:
        with store.transaction() as tx:
            job = tx.get_job(job_id, for_update=True)
            assert job is not None
            seen.append(job.status)

    with raw.transaction() as cur:
        cur.execute(raw.q("UPDATE jobs SET status = 'waiting' WHERE job_id = ?"), (job_id,))
        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)  # the reader waits for the job meanwhile
        assert seen == []
    reader.join(timeout=30)
    assert seen == ["waiting"]


@pytest.mark.parametrize("via", ["transaction", "store"])
def test_a_claim_says_whether_it_recovers_the_job_and_what_was_counted(
    store: Store, via: str
) -> None:
    """A claim that finds the lease expired with its owner (the run before neither finished
    nor handed the job back) is a recovery and returns the count its runtime recorded; a
    pending job or a handed-back one starts the count again. The same in a transaction and as
    a transaction of its own (``Store.claim``, a worker's)."""
    job_id = make_job(store)
    now = time.time()

    def claim(at: float, attempt: str) -> Claimed:
        kw: dict[str, Any] = {"owner": attempt, "attempt_id": attempt, "now": at}
        if via == "store":
            claimed = store.claim(**kw, lease_seconds=10)
        else:
            with store.transaction() as tx:
                claimed = tx.claim(**kw, lease_seconds=10)
        assert claimed is not None
        job = store.get_job(job_id)
        assert (job.status, job.attempt_id, job.lease_owner) == ("running", attempt, attempt)
        assert job.lease_expires_at == pytest.approx(at + 10)
        return claimed

    assert claim(now, "a1") == Claimed(job_id)  # pending
    assert claim(now + 11, "a2") == Claimed(job_id, recovered=True)  # a1's lease ran out
    with store.transaction() as tx:
        tx.set_recoveries(job_id, "a1", 5, 50)  # not a1's claim any more: fenced off
        tx.set_recoveries(job_id, "a2", 1, 3)
    assert claim(now + 22, "a3") == Claimed(job_id, True, 1, 3)
    with store.transaction() as tx:
        assert tx.release_lease(job_id, "a3", now + 23)
    assert claim(now + 24, "a4") == Claimed(job_id)  # handed back: not a recovery, reset
    assert claim(now + 35, "a5") == Claimed(job_id, recovered=True)
    with store.transaction() as tx:
        tx.set_recoveries(job_id, "a5", 2, 7)
        # handed back untouched (a worker without the job's tools): still a recovery
        assert tx.release_lease(job_id, "a5", now + 36, keep_owner=True)
    assert claim(now + 37, "a6") == Claimed(job_id, True, 2, 7)


def test_a_claim_with_log_returns_the_log_the_claim_saw(store: Store) -> None:
    """``Store.claim(with_log=True)``: where the backend reads the log with the claim
    (PostgreSQL) it is the claimed job's whole log, as read after the claim took it — also
    for a recovery, whose log another run wrote — and never another job's; where it does not
    (SQLite) it is ``None`` and the claimer reads the log itself. Without ``with_log``, never."""
    first = make_job(store)
    second = make_job(store)
    store.append(first, [ev(1), ev(2)], expected_version=0)
    now = time.time()
    claimed = store.claim(owner="w", attempt_id="a1", now=now, lease_seconds=10, with_log=True)
    assert claimed is not None and claimed.job_id == first
    if store.backend == "sqlite":
        assert claimed.log is None
    else:
        assert claimed.log is not None
        assert list(claimed.log) == store.list_events(first)
        assert [e.version for e in claimed.log] == [1, 2]
    # the other job, without the log; then the first again, recovered after its lease ran out
    plain = store.claim(owner="w", attempt_id="a2", now=now, lease_seconds=10)
    assert plain is not None and (plain.job_id, plain.log) == (second, None)
    store.append(first, [ev(3)], expected_version=2, fence="a1")
    again = store.claim(owner="w", attempt_id="a3", now=now + 11, lease_seconds=10, with_log=True)
    assert again is not None and (again.job_id, again.recovered) == (first, True)
    if store.backend != "sqlite":
        assert again.log is not None and [e.version for e in again.log] == [1, 2, 3]
        assert list(again.log) == store.list_events(first)
    assert store.claim(owner="w", attempt_id="a4", now=now, lease_seconds=10, with_log=True) is None


def test_a_claim_after_commit_runs_only_once_the_commit_did(store: Store) -> None:
    """``Transaction.claim_after_commit``: where the backend sends the claim with the commit
    (PostgreSQL) it is made once the transaction committed — the job it takes leased to the
    request's attempt, its log read with it — and not made when the transaction is refused;
    a request is sent once. Elsewhere (SQLite) nothing is done: the claimer claims itself."""
    ending = make_job(store)
    waiting = make_job(store)
    store.append(waiting, [ev(1)], expected_version=0)
    now = time.time()
    first = store.claim(owner="w", attempt_id="a1", now=now, lease_seconds=10)
    assert first is not None and first.job_id == ending

    # refused by a check the server makes in the commit's message (PostgreSQL), or at once
    events = store.list_events(ending)
    head = bytes.fromhex(events[-1].chain_hash) if events else b""
    refused = NextClaim("w", "a2", now, 10, with_log=True)
    with pytest.raises(FencedError), store.transaction() as tx:
        tx.claim_after_commit(refused)
        tx.append(
            ending,
            encoded=[("e-refused", "node_started", b"{}")],
            expected_version=len(events),
            fence="not-a1",
            head=head,
            hashes=True,
        )
    assert refused.sent == (store.backend == "postgresql")
    assert not refused.made and refused.claimed is None
    assert store.get_job(waiting).attempt_id is None  # the claim never ran

    request = NextClaim("w", "a3", now, 10, with_log=True)
    with store.transaction() as tx:
        tx.update_job(ending, status="completed", fence="a1")
        tx.claim_after_commit(request)
    assert store.get_job(ending).status == "completed"
    if store.backend == "sqlite":
        assert not request.sent and not request.made
        assert store.get_job(waiting).attempt_id is None
        return
    assert request.sent and request.made and request.claimed is not None
    assert request.claimed.job_id == waiting and not request.claimed.recovered
    assert request.claimed.log is not None
    assert list(request.claimed.log) == store.list_events(waiting)
    job = store.get_job(waiting)
    assert (job.status, job.attempt_id, job.lease_owner) == ("running", "a3", "w")
    assert job.lease_expires_at == pytest.approx(now + 10)

    with store.transaction() as tx:  # sent already: not again
        tx.claim_after_commit(request)
        tx.update_job(waiting, status="completed", fence="a3")
    assert request.claimed.job_id == waiting
    nothing = NextClaim("w", "a4", now, 10)
    with store.transaction() as tx:
        tx.claim_after_commit(nothing)
    assert nothing.made and nothing.claimed is None  # made: nothing was runnable


def test_concurrent_claims_take_each_job_once(store: Store) -> None:
    """Eight claimers at once (``Store.claim``, each its own transaction): every job is taken
    by exactly one of them, and each claim leases the job it returns."""
    jobs = {make_job(store) for _ in range(24)}
    now = time.time()
    taken: list[tuple[str, str]] = []
    lock = threading.Lock()

    def claimer(k: int) -> None:
        n = 0
        while True:
            attempt = f"a{k}-{n}"
            claimed = store.claim(owner=f"w{k}", attempt_id=attempt, now=now, lease_seconds=60)
            if claimed is None:
                return
            with lock:
                taken.append((claimed.job_id, attempt))
            n += 1

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(job for job, _ in taken) == sorted(jobs)
    for job_id, attempt in taken:
        assert store.get_job(job_id).attempt_id == attempt


def test_a_run_sets_its_jobs_status_under_its_fence(store: Store) -> None:
    """``set_status`` (a run's, after its fenced append) records the status and the output or
    error; under an attempt that no longer holds the lease it changes nothing."""
    job_id = make_job(store)
    now = time.time()
    assert store.claim(owner="w", attempt_id="a1", now=now, lease_seconds=10) == Claimed(job_id)
    with store.transaction() as tx:
        tx.set_status(job_id, status="completed", fence="another", output={"r": 0})
    assert store.get_job(job_id).status == "running"
    with store.transaction() as tx:
        tx.set_status(job_id, status="completed", fence="a1", output={"r": 1})
    job = store.get_job(job_id)
    assert (job.status, job.output, job.error) == ("completed", {"r": 1}, None)
    with pytest.raises(ConfigError), store.transaction() as tx:
        tx.set_status(job_id, status="finished", fence="a1")


def test_lease_claim_heartbeat_and_release_are_fenced(store: Store) -> None:
    """A lease is extended and given back only by the attempt that holds it; a released job
    names no owner and is claimed at once, with a new attempt that fences the old one off."""
    job_id = make_job(store)
    now = time.time()
    with store.transaction() as tx:
        assert tx.claim(owner="w1", attempt_id="a1", now=now, lease_seconds=30) == Claimed(job_id)
    with store.transaction() as tx:
        assert tx.heartbeat(job_id, "a1", now + 60)
        assert not tx.heartbeat(job_id, "other", now + 60)
        assert not tx.release_lease(job_id, "other", now)
    held = store.get_job(job_id)
    assert (held.lease_owner, held.lease_expires_at) == ("w1", pytest.approx(now + 60))
    with store.transaction() as tx:  # the lease runs until now + 60: nobody else claims it
        assert tx.claim(owner="w2", attempt_id="a2", now=now + 1, lease_seconds=30) is None
    with store.transaction() as tx:
        assert tx.release_lease(job_id, "a1", now + 1)
    released = store.get_job(job_id)
    assert (released.status, released.attempt_id, released.lease_owner) == ("running", "a1", None)
    assert released.lease_expires_at == pytest.approx(now + 1)
    with store.transaction() as tx:
        claimed = tx.claim(owner="w2", attempt_id="a2", now=now + 2, lease_seconds=30)
        assert claimed == Claimed(job_id)  # handed back: not a recovery
    with store.transaction() as tx:
        assert not tx.heartbeat(job_id, "a1", now + 90)
        assert not tx.release_lease(job_id, "a1", now + 2)
    taken = store.get_job(job_id)
    assert (taken.attempt_id, taken.lease_owner) == ("a2", "w2")
