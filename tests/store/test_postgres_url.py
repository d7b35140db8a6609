"""PostgreSQL URLs: passwords with special characters, schemas, redaction."""

from __future__ import annotations

import threading
import time
import uuid
from urllib.parse import quote

import psycopg
import pytest

from affidavit.core.errors import ConfigError, StoreError, StoreUnavailable
from affidavit.store import NewEvent, open_store
from affidavit.store.postgres import (
    PostgresStore,
    pool_size_of,
    pool_timeout_of,
    prepare_of,
    redact,
    split_url,
)
from tests.conftest import PG_URL

SPECIAL_PASSWORD = "p@ss:w/rd?#%&=+ ü'\"\\"


def test_password_with_special_characters(pg_schema: str) -> None:
    role = f"affidavit_pw_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                psycopg.sql.Identifier(role), psycopg.sql.Literal(SPECIAL_PASSWORD)
            )
        )
        dbname = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        admin.execute(
            psycopg.sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                psycopg.sql.Identifier(dbname), psycopg.sql.Identifier(role)
            )
        )
    host_part = PG_URL.split("@", 1)[1]
    url = f"postgresql://{role}:{quote(SPECIAL_PASSWORD, safe='')}@{host_part}?schema={pg_schema}"
    try:
        store = open_store(url)
        try:
            job, _ = store.create_job()
            store.append(job.job_id, [NewEvent("node_started", {"ok": True})], expected_version=0)
            assert store.get_job(job.job_id).version == 1
        finally:
            store.close()
        assert SPECIAL_PASSWORD not in redact(url)
        assert quote(SPECIAL_PASSWORD, safe="") not in redact(url)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
            admin.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(psycopg.sql.Identifier(role)))
            admin.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))


def test_schema_parameter_is_ours_and_the_rest_goes_to_libpq() -> None:
    conninfo, schema = split_url(
        "postgresql://u@h:5/db?connect_timeout=3&schema=abc&sslmode=disable"
    )
    assert schema == "abc"
    assert conninfo == "postgresql://u@h:5/db?connect_timeout=3&sslmode=disable"
    assert split_url("postgresql://u@h/db") == ("postgresql://u@h/db", None)
    with pytest.raises(ConfigError, match="invalid schema"):
        split_url("postgresql://u@h/db?schema=x;drop")


def test_libpq_options_with_spaces_reach_the_server(pg_schema: str) -> None:
    """``options=-c name=value`` (a space, %-encoded) is how a URL sets a server setting; it
    reaches libpq as written next to our ``schema`` parameter (a space re-encoded as ``+``
    would reach the server as part of the setting's name)."""
    options = quote("-c idle_in_transaction_session_timeout=5000", safe="")
    assert split_url(f"postgresql://u@h/db?schema=s&options={options}") == (
        f"postgresql://u@h/db?options={options}",
        "s",
    )
    store = open_store(f"{PG_URL}?schema={pg_schema}&options={options}")
    try:
        with store.transaction() as tx:
            assert tx.query("SHOW idle_in_transaction_session_timeout") == [("5s",)]
    finally:
        store.close()


def test_sessions_are_configured_with_the_stores_settings(pg_schema: str) -> None:
    """Every pooled session (configured in one message): durable commits, no JIT, the
    schema first on the search path, and the store's idle-in-transaction bound where the
    server sets none."""
    store = open_store(f"{PG_URL}?schema={pg_schema}", connections=3)
    try:
        with store.transaction() as tx:
            shown = tx.query(
                "SELECT current_setting('synchronous_commit'), current_setting('jit'), "
                "current_schema(), current_setting('idle_in_transaction_session_timeout')"
            )
        assert shown == [("on", "off", pg_schema, "10s")]
    finally:
        store.close()


def test_unreachable_server_is_a_clear_store_error() -> None:
    with pytest.raises(StoreError, match="cannot connect") as info:
        open_store("postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=1")
    assert "secret" not in info.value.message
    # the cause, not only libpq's advice on the line after it
    assert "port 1 failed: Connection refused" in info.value.message
    assert info.value.message.rstrip().endswith("accepting TCP/IP connections?")


def test_pool_size_parameter_bounds_the_pool(pg_schema: str) -> None:
    """``pool_size`` is ours too: it never reaches libpq, and the pool holds at most that many
    connections — a third concurrent transaction waits for one of two to end."""
    assert split_url("postgresql://u@h/db?pool_size=3&sslmode=disable&schema=s") == (
        "postgresql://u@h/db?sslmode=disable",
        "s",
    )
    assert pool_size_of("postgresql://u@h/db") == 10
    assert pool_size_of("postgresql://u@h/db?schema=s&pool_size=250") == 250
    store = open_store(f"{PG_URL}?schema={pg_schema}&pool_size=2")
    try:
        assert isinstance(store, PostgresStore) and store.pool_size == 2
        order: list[str] = []
        both_open = threading.Barrier(2)

        def hold(name: str) -> None:
            with store.transaction() as tx:
                tx.query("SELECT 1")
                order.append(f"{name} open")
                both_open.wait(timeout=10)
                time.sleep(0.3)
                order.append(f"{name} done")

        holders = [threading.Thread(target=hold, args=(n,)) for n in ("a", "b")]
        for thread in holders:
            thread.start()
        while len(order) < 2:
            time.sleep(0.01)
        with store.transaction() as tx:  # a third: only when a or b gave its connection back
            tx.query("SELECT 1")
            order.append("third open")
        for thread in holders:
            thread.join()
        assert order.index("third open") > min(order.index("a done"), order.index("b done"))
    finally:
        store.close()


@pytest.mark.parametrize("value", ["0", "-1", "1001", "ten", "²", "", "5&pool_size=6"])
def test_a_bad_pool_size_is_refused_before_connecting(value: str) -> None:
    # (an unroutable host: a check made after connecting would fail on the connection instead)
    url = f"postgresql://u@192.0.2.1:5432/db?connect_timeout=1&pool_size={value}"
    with pytest.raises(ConfigError, match="invalid pool_size") as info:
        open_store(url)
    assert "1 to 1,000" in (info.value.hint or "")


def test_pool_timeout_parameter_bounds_the_wait_for_a_connection(pg_schema: str) -> None:
    """``pool_timeout`` is ours: it never reaches libpq, and an operation that finds no
    connection for that long fails as unavailable (to be tried again) instead of waiting on."""
    assert split_url("postgresql://u@h/db?pool_timeout=2.5&sslmode=disable") == (
        "postgresql://u@h/db?sslmode=disable",
        None,
    )
    assert pool_timeout_of("postgresql://u@h/db") == 10
    assert pool_timeout_of("postgresql://u@h/db?pool_timeout=0.25") == 0.25
    store = open_store(f"{PG_URL}?schema={pg_schema}&pool_size=1&pool_timeout=0.5")
    try:
        assert isinstance(store, PostgresStore) and store.pool_timeout == 0.5
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with store.transaction() as tx:
                tx.query("SELECT 1")
                holding.set()
                release.wait(timeout=30)

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(timeout=10)
        started = time.monotonic()
        with (
            pytest.raises(StoreUnavailable, match=r"get a connection after 0\.50 sec"),
            store.transaction() as tx,  # the one connection is taken
        ):
            tx.query("SELECT 1")
        waited = time.monotonic() - started
        release.set()
        holder.join()
        assert 0.4 < waited < 5, waited
        with store.transaction() as tx:  # given back: the next one gets it
            assert tx.query("SELECT 1") == [(1,)]
    finally:
        store.close()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "ten", "", "5&pool_timeout=6"])
def test_a_bad_pool_timeout_is_refused_before_connecting(value: str) -> None:
    url = f"postgresql://u@192.0.2.1:5432/db?connect_timeout=1&pool_timeout={value}"
    with pytest.raises(ConfigError, match="invalid pool_timeout") as info:
        open_store(url)
    assert "positive number of seconds" in (info.value.hint or "")


def test_prepare_parameter_is_ours_and_checked() -> None:
    """``prepare`` never reaches libpq; it is on unless the URL says off, and anything else
    is refused with what to give instead."""
    assert split_url("postgresql://u@h/db?prepare=off&sslmode=disable") == (
        "postgresql://u@h/db?sslmode=disable",
        None,
    )
    assert prepare_of("postgresql://u@h/db") is True
    assert prepare_of("postgresql://u@h/db?prepare=on") is True
    assert prepare_of("postgresql://u@h/db?prepare=off") is False
    for bad in ("prepare=no", "prepare=", "prepare=on&prepare=off"):
        with pytest.raises(ConfigError, match="invalid prepare") as info:
            prepare_of(f"postgresql://u@h/db?{bad}")
        assert "transaction mode" in (info.value.hint or "")


def test_a_store_opens_the_connections_it_is_asked_for_before_it_returns(
    pg_schema: str,
) -> None:
    """``open_store(connections=N)`` (a worker: one per job it runs at once, plus two) has N
    connections open when it returns, so no first job waits for one; never more than the
    URL's ``pool_size``."""
    with pytest.raises(ConfigError, match="connections must be at least 1"):
        open_store(f"{PG_URL}?schema={pg_schema}", connections=0)
    for asked, pool_size, held in ((6, 10, 6), (12, 3, 3)):
        store = open_store(f"{PG_URL}?schema={pg_schema}&pool_size={pool_size}", connections=asked)
        try:
            assert isinstance(store, PostgresStore)
            assert store._pool.get_stats()["pool_size"] == held
        finally:
            store.close()
