"""Event ids stay unique across the database: ids the store makes by construction, every other
id by a unique key (migration 6 made that key partial). Both backends' key predicates must agree
with :func:`affidavit.core.ids.is_generated_id`, and a database made before migration 6 keeps
its events, in order, when it is upgraded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit.core.canonical import canonical
from affidavit.core.errors import InvalidEventError, StoreError
from affidavit.core.ids import is_generated_id, new_attempt_id, new_event_id, new_event_ids
from affidavit.store import Store, migrations, open_store
from affidavit.store.base import NewEvent
from tests.store.legacy import undo_migration_6
from tests.store.test_store import chain_ok, make_job
from tests.verify.helpers import RawDb

_HEX = "0123456789abcdef"


def _append_twice(store: Store, event_id: str) -> bool:
    """Append two events that share ``event_id`` (through ``append(encoded=...)``, which leaves
    ids to its caller); whether the database took them."""
    job_id = make_job(store)
    attempt = new_attempt_id()
    rows = [(event_id, "node_started", canonical({"n": n})) for n in (1, 2)]
    try:
        with store.transaction() as tx:
            tx.set_lease(job_id, attempt_id=attempt, owner="t", expires_at=1.0)
            tx.append(job_id, encoded=rows, expected_version=0, head=b"", fence=attempt)
    except StoreError:
        assert store.get_job(job_id).version == 0
        return False
    return True


def _near_generated() -> st.SearchStrategy[str]:
    """Ids of the generated form and one-character variations of it (a wrong version or
    variant digit, upper case, one digit more or less, a trailing newline)."""
    base = st.builds(new_event_id)

    def vary(pair: tuple[str, int, str]) -> str:
        value, at, kind = pair
        at %= len(value)
        if kind == "upper":
            return value[:at] + value[at].upper() + value[at + 1 :]
        if kind == "drop":
            return value[:at] + value[at + 1 :]
        if kind == "extra":
            return value + "0"
        if kind == "newline":
            return value + "\n"
        if kind == "version":
            return value[:12] + _HEX[at % 16] + value[13:]
        return value[:16] + _HEX[at % 16] + value[17:]  # the variant digit

    kinds = st.sampled_from(["upper", "drop", "extra", "newline", "version", "variant"])
    return st.one_of(base, st.tuples(base, st.integers(0, 31), kinds).map(vary))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(event_id=_near_generated())
def test_the_database_keys_exactly_the_ids_the_store_does_not_make(
    store: Store, event_id: str
) -> None:
    assert _append_twice(store, event_id) is is_generated_id(event_id)


def test_the_generated_form() -> None:
    ids = new_event_ids(1000)
    assert all(is_generated_id(i) for i in ids) and is_generated_id(new_attempt_id())
    assert not any(is_generated_id(i) for i in ("e1", "same-id", ids[0].upper(), ids[0] + "\n"))


def test_a_caller_cannot_choose_an_id_of_the_generated_form(store: Store) -> None:
    job_id = make_job(store)
    with pytest.raises(InvalidEventError, match="form of the ids the store makes"):
        store.append(
            job_id, [NewEvent("node_started", {}, event_id=new_event_id())], expected_version=0
        )
    assert store.get_job(job_id).version == 0
    store.append(job_id, [NewEvent("node_started", {}, event_id="chosen-1")], expected_version=0)
    with pytest.raises(StoreError):
        store.append(
            make_job(store), [NewEvent("node_started", {}, event_id="chosen-1")], expected_version=0
        )


def _rows(store: Store, job_id: str) -> list[tuple[Any, ...]]:
    return [
        (e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash)
        for e in store.list_events(job_id)
    ]


def test_an_older_database_keeps_its_events_through_the_upgrade(store_url: str) -> None:
    store = open_store(store_url)
    try:
        jobs = [make_job(store) for _ in range(3)]
        for n, job_id in enumerate(jobs):
            events = [NewEvent("node_started", {"n": k}) for k in range(n + 2)]
            store.append(job_id, events, expected_version=0)
        chosen = NewEvent("node_finished", {}, event_id="kept-unique")
        store.append(jobs[0], [chosen], expected_version=2)
        before = {job_id: _rows(store, job_id) for job_id in jobs}
    finally:
        store.close()
    undo_migration_6(store_url)
    raw = RawDb(store_url)
    assert raw.rows("SELECT max(version) FROM affidavit_schema_migrations") == [(5,)]

    store = open_store(store_url)
    try:
        folder = "sqlite" if store.backend == "sqlite" else "postgres"
        assert store.schema_version() == migrations.load(folder)[-1].version
        assert {job_id: _rows(store, job_id) for job_id in jobs} == before
        assert all(chain_ok(store, job_id) for job_id in jobs)
        if store.backend == "sqlite":  # every job numbered, every log a range of seq
            numbers = raw.rows("SELECT number FROM jobs")
            assert len(set(numbers)) == len(numbers) and None not in {n for (n,) in numbers}
            misplaced = "SELECT count(*) FROM events e JOIN jobs j USING (job_id) "
            assert raw.rows(misplaced + "WHERE e.seq <> (j.number << 32) + e.version") == [(0,)]
        # new events follow the old ones
        store.append(jobs[1], [NewEvent("node_finished", {})], expected_version=3)
        assert [e.version for e in store.list_events(jobs[1])] == [1, 2, 3, 4]
        assert chain_ok(store, jobs[1])
        # the key now holds chosen ids only, the ones from before the upgrade included
        with pytest.raises(StoreError):
            store.append(jobs[2], [chosen], expected_version=4)
        assert _append_twice(store, new_event_id()) is True
        assert _append_twice(store, "chosen-twice") is False
    finally:
        store.close()


def test_an_event_without_its_job_stops_the_sqlite_upgrade(tmp_path: Path) -> None:
    """The store never writes one; a hand-made one is not dropped silently."""
    url = f"sqlite:///{tmp_path / 'affidavit.db'}"
    store = open_store(url)
    job_id = make_job(store)
    store.append(job_id, [NewEvent("node_started", {})], expected_version=0)
    store.close()
    undo_migration_6(url)
    raw = RawDb(url)
    raw.execute("UPDATE events SET job_id = 'gone' WHERE job_id = ?", (job_id,))
    with pytest.raises(StoreError, match="NOT NULL"):
        open_store(url)
    assert raw.rows("SELECT max(version) FROM affidavit_schema_migrations") == [(5,)]
    assert raw.rows("SELECT count(*) FROM events") == [(1,)]
