"""PostgreSQL migrators take an advisory lock of their schema: migrators of one schema run one
at a time, those of other schemas on the same server do not wait for each other."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from affidavit.store import migrations, open_store
from affidavit.store.postgres import migration_lock
from tests.conftest import PG_URL, drop_schema, with_schema


@pytest.fixture
def other_schema(pg_schema: str) -> Iterator[str]:
    name = pg_schema + "_b"
    yield name
    drop_schema(name)


def test_the_lock_is_the_schemas() -> None:
    assert migration_lock("t_a") == migration_lock("t_a")
    assert migration_lock("t_a") != migration_lock("t_b")
    assert migration_lock(None) == migration_lock("public")
    assert migration_lock(None) not in (migration_lock("t_a"), migration_lock("t_b"))


def _open_in_thread(url: str) -> tuple[threading.Thread, list[object]]:
    done: list[object] = []

    def run() -> None:
        try:
            store = open_store(url)
            store.close()
            done.append("opened")
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def _waiting_for(admin: psycopg.Connection[object], key: int) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND ((classid::bigint << 32) | objid::bigint) = %s",
        (key,),
    ).fetchone()
    return row is not None and int(row[0]) > 0


def test_a_migrator_waits_for_another_of_its_schema_only(pg_schema: str, other_schema: str) -> None:
    with (
        psycopg.connect(PG_URL, autocommit=True) as holder,
        psycopg.connect(PG_URL, autocommit=True) as admin,
    ):
        holder.execute("SELECT pg_advisory_lock(%s)", (migration_lock(pg_schema),))
        try:
            # another schema's migrator does not wait for the lock held here
            other, other_done = _open_in_thread(with_schema(PG_URL, other_schema))
            other.join(timeout=120)
            assert other_done == ["opened"]
            # this schema's migrator waits until the lock is released
            same, same_done = _open_in_thread(with_schema(PG_URL, pg_schema))
            deadline = time.monotonic() + 120
            while not _waiting_for(admin, migration_lock(pg_schema)):
                assert time.monotonic() < deadline, "the migrator never asked for the lock"
                time.sleep(0.02)
            assert same_done == []
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (migration_lock(pg_schema),))
        same.join(timeout=120)
        assert same_done == ["opened"]
    store = open_store(with_schema(PG_URL, pg_schema))
    try:
        assert store.schema_version() == migrations.load("postgres")[-1].version
    finally:
        store.close()


def test_migrators_of_one_schema_at_once_apply_each_migration_once(pg_schema: str) -> None:
    url = with_schema(PG_URL, pg_schema)
    started = [_open_in_thread(url) for _ in range(4)]
    for thread, _ in started:
        thread.join(timeout=120)
    assert [done for _, done in started] == [["opened"]] * 4
    with psycopg.connect(PG_URL) as conn:
        rows = conn.execute(
            f'SELECT version FROM "{pg_schema}".{migrations.VERSION_TABLE} ORDER BY version'
        ).fetchall()
    assert [r[0] for r in rows] == [m.version for m in migrations.load("postgres")]
