"""The PostgreSQL store binds its statements' values on the client (``PostgresTransaction``):
text, integers, finite floats, bytes, booleans and NULL as literals it writes itself, anything
else through psycopg. Whatever the value, the server must read exactly it — never SQL."""

from __future__ import annotations

import math
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit.core.errors import StoreError
from affidavit.store import Store, open_store
from affidavit.store._pg_statements import _literal
from tests.conftest import PG_URL, with_schema

BIGINT = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# (no NUL and no lone surrogate: neither can be PostgreSQL text, or UTF-8 at all)
TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=60
)
# what hostile text tends to hold: quotes, backslashes, comment and statement separators
NASTY = st.text(alphabet="'\\\"-;/*$xE \n\t\u00e9\u2028", max_size=40)
VALUE = st.one_of(st.none(), st.booleans(), BIGINT, st.binary(max_size=60), TEXT, NASTY)


@pytest.fixture(scope="module")
def pg_store() -> Iterator[Store]:
    import uuid

    from tests.conftest import drop_schema, pg_available

    if not pg_available():
        pytest.fail(f"PostgreSQL is required for this test but unreachable at {PG_URL}")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    store = open_store(with_schema(PG_URL, schema))
    yield store
    store.close()
    drop_schema(schema)


def _read_back(store: Store, values: list[Any], *, conforming: bool = True) -> list[Any]:
    placeholders = ", ".join("?" for _ in values)
    with store.transaction() as tx:
        if not conforming:
            tx.execute("SET LOCAL standard_conforming_strings = off")
        [row] = tx.query(f"SELECT {placeholders}", values)
    return list(row)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.lists(VALUE, min_size=1, max_size=6), conforming=st.booleans())
def test_every_value_reads_back_as_itself(
    pg_store: Store, values: list[Any], conforming: bool
) -> None:
    assert _read_back(pg_store, values, conforming=conforming) == values


def test_a_value_that_looks_like_sql_is_stored_as_text(pg_store: Store) -> None:
    attack = "x'); DROP TABLE jobs; --"
    escaped = "a\\'); DROP TABLE jobs; --"
    dollar = "$$; DROP TABLE jobs; $$"
    assert _read_back(pg_store, [attack, escaped, dollar, -1]) == [attack, escaped, dollar, -1]
    assert pg_store.list_jobs() == []  # the table is still there


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.none(), st.booleans(), BIGINT, st.floats()))
def test_the_store_writes_a_number_as_psycopg_does(value: Any) -> None:
    """A number (or NULL, or a boolean) the store writes itself is written as psycopg's
    client-side binding writes it. (Text and bytes are not always: the store writes them as
    escape strings whatever ``standard_conforming_strings`` is; they are read back above.)"""
    written = _literal(value)
    if written is not None:
        cursor = psycopg.ClientCursor(psycopg.connect(PG_URL))
        try:
            assert written == cursor.mogrify("SELECT %s", [value]).removeprefix("SELECT ")
        finally:
            cursor.connection.close()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=st.floats())
def test_every_float_reads_back_as_itself(pg_store: Store, value: float) -> None:
    with pg_store.transaction() as tx:
        [(read,)] = tx.query("SELECT ?::float8", [value])
    if math.isnan(value):  # (PostgreSQL keeps no sign of a NaN)
        assert math.isnan(read)
    else:
        assert read == value and math.copysign(1.0, read) == math.copysign(1.0, value)


def test_other_types_are_bound_by_psycopg(pg_store: Store) -> None:
    """A value of a type the store does not write itself (here an infinite float, a decimal)
    makes psycopg bind the whole statement; an integer past bigint is a numeric."""
    assert _read_back(pg_store, [math.inf, "a'b", 7]) == [math.inf, "a'b", 7]
    assert _read_back(pg_store, [Decimal("1.25"), -1]) == [Decimal("1.25"), -1]
    assert _read_back(pg_store, [2**70]) == [Decimal(2**70)]


def test_text_holding_nul_is_refused(pg_store: Store) -> None:
    with pytest.raises(StoreError, match="NUL"), pg_store.transaction() as tx:
        tx.query("SELECT ?", ["a\x00b"])
