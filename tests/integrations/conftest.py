"""Fixtures of the integration tests: a database of each backend shared by a module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import BACKENDS, PG_URL, REQUIRE_PG, drop_schema, pg_available, with_schema


@pytest.fixture(scope="module", params=BACKENDS)
def db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A URL of an empty database, once per backend, shared by the tests of a module."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('integ') / 'affidavit.db'}"
        return
    if not pg_available():
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL is required but unreachable at {PG_URL}")
        pytest.skip(f"PostgreSQL unreachable at {PG_URL}")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield with_schema(PG_URL, schema)
    drop_schema(schema)
