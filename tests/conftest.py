"""Shared fixtures. Every store test runs against SQLite and PostgreSQL via ``store_url``.

PostgreSQL: ``AFFIDAVIT_TEST_PG_URL`` (default the local server). Each test gets a schema of its
own (``store_url``: a migrated one, given back empty; ``pg_schema``, ``empty_store_url``: a new
one, dropped afterwards), so runs never collide. With ``AFFIDAVIT_REQUIRE_PG=1`` (CI) an
unreachable server fails the run instead of skipping the PostgreSQL half.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from affidavit.store import Store, open_store
from tests.migrated import PgSchemas, SqliteTemplate

# pytest rewrites the asserts of each test module it imports and keeps the result beside the
# module (__pycache__/*-pytest-*.pyc) unless bytecode is not to be written: where
# PYTHONDONTWRITEBYTECODE is set, every test process (each xdist worker) rewrote the ~500
# modules again, ~9 s of CPU of its ~20 s of collection. This process writes them; the
# variable stays set for the processes the tests start.
sys.dont_write_bytecode = False

PG_URL = os.environ.get("AFFIDAVIT_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/test")
REQUIRE_PG = os.environ.get("AFFIDAVIT_REQUIRE_PG") == "1"
BACKENDS = ["sqlite", "postgresql"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="also run long soak tests")
    parser.addoption(
        "--chaos-long",
        action="store_true",
        help="run the chaos suite (tests/chaos) in its long form instead of the bounded one",
    )
    parser.addoption(
        "--fast",
        action="store_true",
        help="the edit loop (make test-fast): SQLite only, no browser, no chaos suite",
    )


_soak = False


def pytest_configure(config: pytest.Config) -> None:
    global _soak
    _soak = bool(config.getoption("--soak"))


def examples(bounded: int, soak: int) -> int:
    """How many examples a property or fuzz test draws: ``bounded`` in the default suite,
    ``soak`` with ``--soak`` (make test-all). Read when the test module is imported, which is
    after the options are parsed."""
    return soak if _soak else bounded


# Fixtures that bring a PostgreSQL server into a test: with --fast such tests are left out.
_PG_FIXTURES = frozenset({"pg_schema", "pg_database", "pg_store"})


def _left_out_by_fast(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "postgresql" in callspec.params.values():
        return True
    if _PG_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    return any(item.iter_markers("browser")) or any(item.iter_markers("chaos"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--fast"):
        left_out = [item for item in items if _left_out_by_fast(item)]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not _left_out_by_fast(item)]
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak (make test-all)")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


_pg_ok: bool | None = None


def pg_available() -> bool:
    global _pg_ok
    if _pg_ok is None:
        try:
            with psycopg.connect(PG_URL, connect_timeout=5):
                _pg_ok = True
        except psycopg.Error:
            _pg_ok = False
    return _pg_ok


def with_schema(url: str, schema: str) -> str:
    return url + ("&" if "?" in url else "?") + f"schema={schema}"


def drop_schema(schema: str) -> None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _require_pg() -> None:
    if not pg_available():
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL is required but unreachable at {PG_URL}")
        pytest.skip(f"PostgreSQL unreachable at {PG_URL} (set AFFIDAVIT_REQUIRE_PG=1 to fail)")


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh PostgreSQL schema name, dropped after the test."""
    _require_pg()
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield schema
    drop_schema(schema)


@pytest.fixture(params=BACKENDS)
def empty_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty database (nothing migrated), once per backend: for the tests of
    migrating a database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'affidavit.db'}"
    schema = request.getfixturevalue("pg_schema")
    return with_schema(PG_URL, schema)


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> SqliteTemplate:
    return SqliteTemplate(tmp_path_factory.mktemp("migrated"))


@pytest.fixture(scope="session")
def _pg_schemas() -> Iterator[PgSchemas]:
    _require_pg()
    schemas = PgSchemas(PG_URL)
    yield schemas
    schemas.close()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of a migrated database with no jobs (nor anything else but what the migrations
    write), once per backend: a copy of one migrated once per test process
    (tests/migrated.py). A test that also asks for ``pg_schema`` gets that schema, migrated
    when the test first opens it."""
    if request.param == "sqlite":
        template: SqliteTemplate = request.getfixturevalue("_sqlite_template")
        yield template.copy_to(tmp_path / "affidavit.db")
        return
    if "pg_schema" in request.fixturenames:
        yield with_schema(PG_URL, request.getfixturevalue("pg_schema"))
        return
    schemas: PgSchemas = request.getfixturevalue("_pg_schemas")
    schema = schemas.lend()
    try:
        yield with_schema(PG_URL, schema)
    finally:
        schemas.give_back(schema)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _signing_key_in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Seals are signed with a key file; tests keep theirs in the test's directory (never in
    the home directory, the default for PostgreSQL). Tests of the default location unset it."""
    monkeypatch.setenv("AFFIDAVIT_SIGNING_KEY", str(tmp_path / "keys" / "affidavit-signing.key"))


@pytest.fixture
def pg_database() -> Iterator[str]:
    """The name of a PostgreSQL database of its own on the test server, dropped afterwards (a
    test may make it refuse connections without touching any other test)."""
    if not pg_available():
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL is required but unreachable at {PG_URL}")
        pytest.skip(f"PostgreSQL unreachable at {PG_URL} (set AFFIDAVIT_REQUIRE_PG=1 to fail)")
    name = f"affidavit_outage_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    allow_connections(name)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def refuse_connections(database: str) -> None:
    """Take ``database`` (a :func:`pg_database`) away: it refuses new connections and its
    sessions are ended, as in a restart or failover, without touching any other database."""
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (database,),
        )


def allow_connections(database: str) -> None:
    """Give ``database`` back after :func:`refuse_connections`."""
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
