"""Canonical JSON: RFC 8785 examples, the fast path against the reference, rejections."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.core.canonical import (
    MAX_SAFE_INTEGER,
    canonical,
    canonical_parsed,
    canonical_sha256,
    parse,
    sha256_hex,
    sha256_prefixed,
)
from affidavit.core.errors import CanonicalizationError

# RFC 8785 §3.2.2 (the "numbers/string/literals" example) and §3.2.3 (key sorting by UTF-16).
RFC_EXAMPLE_IN = (
    '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
    '"string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
    '"literals": [null, true, false]}'
)
RFC_EXAMPLE_OUT = (
    '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
    '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
)
RFC_SORT_IN = {
    "\u20ac": "Euro Sign",
    "\r": "Carriage Return",
    "\ufb33": "Hebrew Letter Dalet With Dagesh",
    "1": "One",
    "\U0001f600": "Emoji: Grinning Face",
    "\u0080": "Control",
    "\u00f6": "Latin Small Letter O With Diaeresis",
}
RFC_SORT_ORDER = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


def test_rfc8785_number_and_string_example() -> None:
    assert canonical(json.loads(RFC_EXAMPLE_IN)).decode() == RFC_EXAMPLE_OUT


def test_rfc8785_sorts_keys_by_utf16_code_units() -> None:
    out = json.loads(canonical(RFC_SORT_IN))
    assert list(out) == RFC_SORT_ORDER


def test_no_whitespace_and_sorted_nested() -> None:
    assert canonical({"b": [1, {"d": 1, "c": None}], "a": True}) == (
        b'{"a":true,"b":[1,{"c":null,"d":1}]}'
    )


def test_integral_float_is_written_as_integer() -> None:
    assert canonical({"x": 1.0, "y": -0.0}) == b'{"x":1,"y":0}'


def test_hash_helpers() -> None:
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert sha256_prefixed(b"") == "sha256:" + sha256_hex(b"")
    assert canonical_sha256({"b": 1, "a": 2}) == sha256_hex(b'{"a":2,"b":1}')


class Color(StrEnum):
    RED = "red"


def test_str_subclass_serializes_as_string() -> None:
    assert canonical({"c": Color.RED}) == b'{"c":"red"}'


@pytest.mark.parametrize(
    ("value", "path", "fragment"),
    [
        ({"a": {1: "x"}}, "$.a", "object key 1 is not a string"),
        ({"a": [0, 2**53]}, "$.a[1]", "outside"),
        ({"a": [0, -(2**53)]}, "$.a[1]", "outside"),
        ({"n": math.nan}, "$.n", "not finite"),
        ({"n": [math.inf]}, "$.n[0]", "not finite"),
        ({"b": b"raw"}, "$.b", "bytes"),
        ({"deep": {"list": [{"x": object()}]}}, "$.deep.list[0].x", "type object"),
        ({"odd key": {"s": {1, 2}}}, '$["odd key"].s', "type set"),
        ({"s": "\ud800"}, "$.s", "lone surrogate"),
    ],
    ids=[
        "int_key",
        "int_too_big",
        "int_too_small",
        "nan",
        "infinity",
        "bytes",
        "object",
        "set_under_quoted_key",
        "lone_surrogate",
    ],
)
def test_rejects_non_representable_values_naming_the_path(
    value: Any, path: str, fragment: str
) -> None:
    with pytest.raises(CanonicalizationError) as info:
        canonical(value)
    assert info.value.path == path
    assert fragment in info.value.message
    assert path in info.value.message
    assert info.value.hint


def test_parse_reads_big_integral_numbers_as_doubles() -> None:
    once = canonical(9007199254740992.0)
    assert once == b"9007199254740992"
    assert canonical(parse(once)) == once


def test_boundary_integers_are_accepted() -> None:
    assert canonical([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER]) == (
        f"[{MAX_SAFE_INTEGER},{-MAX_SAFE_INTEGER}]".encode()
    )


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=1000, deadline=None)
@given(json_values)
def test_bytes_identical_to_rfc8785_reference(value: Any) -> None:
    try:
        expected = rfc8785.dumps(value)
    except rfc8785.CanonicalizationError:
        with pytest.raises(CanonicalizationError):
            canonical(value)
        return
    assert canonical(value) == expected


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_canonical_is_a_fixed_point(value: Any) -> None:
    try:
        once = canonical(value)
    except CanonicalizationError:
        return
    assert canonical(parse(once)) == once


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet=st.characters(min_codepoint=0xD7F0), max_size=3),
        st.integers(0, 9),
        max_size=6,
    )
)
def test_astral_keys_sort_like_the_reference(value: dict[str, int]) -> None:
    try:
        expected = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError):  # lone surrogates
        with pytest.raises(CanonicalizationError):
            canonical(value)
        return
    assert canonical(value) == expected


@settings(max_examples=3000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_double_is_written_as_the_reference_writes_it(x: float) -> None:
    # the fast path takes non-integral doubles from 1e-4 up; the rest go to rfc8785
    assert canonical(x) == rfc8785.dumps(x)
    assert canonical({"duration_ms": x, "n": 1}) == rfc8785.dumps({"duration_ms": x, "n": 1})


@pytest.mark.parametrize(
    "x",
    [1e-4, -1e-4, 9.999999e-5, 1.5e-5, 3.4e-6, 0.001, 0.5, 12.345, 4503599627370495.5, 5.0, -0.0],
)
def test_doubles_at_the_fast_path_boundaries(x: float) -> None:
    assert canonical([x]) == rfc8785.dumps([x])


@settings(max_examples=1000, deadline=None)
@given(json_values)
def test_canonical_of_parsed_values_is_the_reference(value: Any) -> None:
    try:
        expected = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError):
        return  # not representable: no parser returns it from valid UTF-8 JSON
    parsed = json.loads(json.dumps(value))
    assert canonical_parsed(parsed) == expected


@pytest.mark.parametrize(
    "value",
    [
        1.5,
        -0.0,
        5.0,
        [1.0],
        {"a": 1e21},
        {"a": [2, 3.25]},
        {"t:1.5": "x:1.5", "n": 1},
        {"\U0001f600": 1, "\ufb33": 2},
        {"k": "\U0001f600"},
        {"e": "1e5", "n": [1, 2, 3]},
    ],
)
def test_canonical_of_parsed_values_takes_the_reference_path_where_needed(value: Any) -> None:
    assert canonical_parsed(value) == rfc8785.dumps(value)


def test_canonical_of_parsed_values_rejects_unsafe_integers() -> None:
    with pytest.raises(CanonicalizationError, match="outside"):
        canonical_parsed({"n": [2**60]})


class _Celsius(float):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"backoff_seconds": 1.0, "nodes": [{"id": "a", "n": 2}]},
        {"a": [1.0, -0.0, 2.5, 9007199254740991.0]},
        {"a": 9007199254740992.0, "b": 1.0},
        {"a": 1.0, "b": 1e-7},
        {"a": 1.0, "\U0001f600": 1},
        {"t": _Celsius(21.0), "u": [_Celsius(0.5)]},
    ],
)
def test_integral_doubles_beside_other_values_are_written_as_the_reference(value: Any) -> None:
    assert canonical(value) == rfc8785.dumps(value)


def test_parsed_event_payloads_stay_on_the_fast_path() -> None:
    """Timestamps and hex ids hold ':29.176', 'e5' and the like: they must not send every
    event payload to the reference encoder (a performance property the verifiers rely on)."""
    from affidavit.core.canonical import _ORJSON_OPTIONS, _is_jcs

    payload = {
        "at": "2026-11-22T13:00:29.176000Z",
        "node_id": "s12",
        "step_id": "3e5f0a1b2c3d4e5f",
        "result": {"charged": 12, "receipt": "affidavit:0193-e5:3e5f:1"},
        "duration_ms": 1.25,
    }
    import orjson

    assert _is_jcs(orjson.dumps(payload, option=_ORJSON_OPTIONS))
    assert canonical_parsed(payload) == rfc8785.dumps(payload)
