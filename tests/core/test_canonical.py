"""Canonical JSON: RFC 8785 examples, the fast path against the reference, rejections."""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict, defaultdict
from enum import StrEnum
from typing import Any, NamedTuple

import orjson
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.core.canonical import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    canonical,
    canonical_nested,
    canonical_parsed,
    canonical_sha256,
    has_exponent_number,
    parse,
    sha256_hex,
    sha256_prefixed,
    unsafe_integers_as_doubles,
)
from affidavit.core.errors import CanonicalizationError
from tests.conftest import examples

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


@pytest.mark.parametrize("other", [1, 1e-7], ids=["fast", "slow"])
def test_str_subclass_keys_serialize_as_strings(other: Any) -> None:
    value = {Color.RED: [other], "a": {Color.RED: other}}
    assert canonical(value) == bytes(rfc8785.dumps({"red": [other], "a": {"red": other}}))


class Point(NamedTuple):
    x: Any
    y: Any


@pytest.mark.parametrize(
    ("value", "plain"),
    [
        (OrderedDict(b=1, a=[2]), {"b": 1, "a": [2]}),
        ({"d": defaultdict(list, k=[1.5])}, {"d": {"k": [1.5]}}),
        ([Point(1, 2)], [[1, 2]]),
        (
            {"p": Point(3e-9, OrderedDict({"\U0001f600": 1, "z": 2}))},
            {"p": [3e-9, {"\U0001f600": 1, "z": 2}]},
        ),
    ],
    ids=["ordered_dict", "defaultdict_under_key", "named_tuple_in_list", "slow_path"],
)
def test_container_subclasses_serialize_as_their_base_type(value: Any, plain: Any) -> None:
    assert canonical(value) == bytes(rfc8785.dumps(plain))


def test_container_subclasses_are_checked_naming_the_path() -> None:
    with pytest.raises(CanonicalizationError) as info:
        canonical({"o": OrderedDict(a=[Point(1, math.nan)])})
    assert info.value.path == "$.o.a[0][1]"


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


@settings(max_examples=500, deadline=None)
@given(
    st.recursive(
        st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=3),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=3), c, max_size=4),
        max_leaves=12,
    )
)
def test_values_parsed_with_integers_canonicalize_back_as_doubles(value: Any) -> None:
    """orjson and ``json`` read the digits JCS writes for a double from 2^53 on as an int;
    read as doubles again, every parsed value canonicalizes back to the bytes it came from."""
    once = canonical(value)
    for parsed in (orjson.loads(once), json.loads(once)):
        assert canonical(unsafe_integers_as_doubles(parsed)) == once
    assert unsafe_integers_as_doubles({"n": [2**60, 3]}) == {"n": [float(2**60), 3]}
    assert unsafe_integers_as_doubles(10**400) == 10**400  # no double holds it


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


@settings(max_examples=examples(300, 5000), deadline=None)
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
@given(json_values, st.integers(min_value=0, max_value=3))
def test_canonical_nested_writes_what_canonical_writes(value: Any, levels: int) -> None:
    try:
        expected = canonical(value)
    except CanonicalizationError as exc:
        with pytest.raises(CanonicalizationError) as info:
            canonical_nested(value, levels)
        assert info.value.path == exc.path  # the value's own fault, at its own path
        return
    assert canonical_nested(value, levels) == expected


def _exponent_inside(value: Any) -> bool:
    if isinstance(value, float):
        return b"e" in canonical(value)
    if isinstance(value, dict):
        return any(_exponent_inside(v) for v in value.values())
    if isinstance(value, list):
        return any(_exponent_inside(v) for v in value)
    return False


@settings(max_examples=300, deadline=None)
@given(json_values | st.lists(st.sampled_from([1e-7, 1e21, "1e-7", "x1e+21", 0.5, 10**15])))
def test_has_exponent_number_finds_numbers_not_strings(value: Any) -> None:
    try:
        data = canonical(value)
    except CanonicalizationError:
        return
    assert has_exponent_number(data) == _exponent_inside(value)


def _lists(depth: int, leaf: Any = 1) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


@pytest.mark.parametrize("levels", [0, 1, 2])
def test_canonical_nested_refuses_what_could_not_be_written_that_much_deeper(
    levels: int,
) -> None:
    """A step's result is written again inside the job's output (two levels deeper): one
    that fits alone but not there was committed, and then the job could not complete."""
    deepest = MAX_DEPTH - levels
    assert canonical_nested(_lists(deepest), levels) == canonical(_lists(deepest))
    assert canonical(_lists(deepest + 1)) if levels else True  # fits alone ...
    with pytest.raises(CanonicalizationError) as info:  # ... not where it is written again
        canonical_nested(_lists(deepest + 1), levels)
    assert info.value.reason == (
        f"nested too deeply: arrays and objects may hold one another at most {deepest} "
        "levels deep in a value that is recorded"
    )
    assert info.value.path == "$" and "Flatten the value" in info.value.hint
    with pytest.raises(CanonicalizationError, match="nested too deeply"):
        canonical_nested(_lists(5000), levels)  # deeper than the check can walk: not a crash
    with pytest.raises(CanonicalizationError) as bad:  # a value's own fault still named so
        canonical_nested({"a": [1, {"b": b"raw"}]}, levels)
    assert bad.value.path == "$.a[1].b"


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


@settings(max_examples=examples(1000, 20000), deadline=None)
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


@settings(max_examples=examples(250, 5000), deadline=None)
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

    assert _is_jcs(orjson.dumps(payload, option=_ORJSON_OPTIONS))
    assert canonical_parsed(payload) == rfc8785.dumps(payload)


# The number scan of the parsed-value fast path, as a regular expression: the definition the
# marker scan in affidavit.core.canonical must agree with on every input.
_DIFFERENT_NUMBER = re.compile(rb"(?:^|[:,\[\n])-?[0-9]+(?:(?:\.[0-9]+)?e[-+]|\.0(?![0-9]))")
_SCAN_ALPHABET = st.sampled_from(list(b'0123456789.-+e:,[]{}"\nax'))


@settings(max_examples=examples(1000, 20000), deadline=None)
@given(st.lists(_SCAN_ALPHABET, max_size=40).map(bytes))
def test_number_scan_agrees_with_its_regular_expression(data: bytes) -> None:
    from affidavit.core.canonical import _has_different_number

    assert _has_different_number(data) == (_DIFFERENT_NUMBER.search(data) is not None)


@pytest.mark.parametrize(
    ("data", "found"),
    [
        (b"1e-7", True),
        (b'{"a":1.5e+300}', True),
        (b"[-2.5e-6]", True),
        (b"5.0", True),
        (b'{"a":[1,10.0]}', True),
        (b"x\n-0.0", True),
        (b'{"a":"3e-5"}', False),
        (b'{"id":"0193ab3e-7f00"}', False),
        (b'{"v":"1.0"}', False),
        (b'{"a":10.05}', False),
        (b'{"a":1.25}', False),
        (b"e-", False),
    ],
)
def test_number_scan_examples(data: bytes, found: bool) -> None:
    from affidavit.core.canonical import _has_different_number

    assert _has_different_number(data) is found
    assert (_DIFFERENT_NUMBER.search(data) is not None) is found


# canonical_parsed_exact writes many values in one call with a gap string between them; values
# that hold that string (or end in it after a quote) must not shift the split.
_GAP_LIKE = st.sampled_from(["\x00affidavit\x00", 'x"\x00affidavit\x00', "\x00affidavit", "a"])
_PARSED = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text(max_size=6)
    | _GAP_LIKE
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=examples(200, 5000), deadline=None)
@given(st.lists(_PARSED, max_size=8))
def test_exact_canonical_of_many_parsed_values(values: list[Any]) -> None:
    from affidavit.core.canonical import canonical_parsed_exact

    values = [json.loads(json.dumps(v)) for v in values]  # as a parser returns them
    out = canonical_parsed_exact(values)
    if out is None:
        return  # the caller takes the per-value way: always allowed
    assert out == [rfc8785.dumps(v) for v in values]
    # and parsing those bytes gives each value back exactly (5.0 stays a float, True a bool)
    sort = orjson.OPT_SORT_KEYS
    assert [orjson.dumps(json.loads(b), option=sort) for b in out] == [
        orjson.dumps(v, option=sort) for v in values
    ]


@pytest.mark.parametrize(
    "values",
    [
        [{"a": 1}, "\x00affidavit\x00", [2]],
        [[1, "\x00affidavit\x00", 2], "x"],
        ["\x00affidavit\x00", "\x00affidavit\x00"],
        ['x"\x00affidavit\x00', 1],
        [{"k": "\x00affidavit\x00"}, {"\x00affidavit\x00": 1}],
    ],
)
def test_exact_canonical_declines_values_holding_the_gap(values: list[Any]) -> None:
    from affidavit.core.canonical import canonical_parsed_all, canonical_parsed_exact

    assert canonical_parsed_exact(values) is None
    assert canonical_parsed_all(values) == [rfc8785.dumps(v) for v in values]


def test_exact_canonical_of_plain_values_takes_the_one_call_way() -> None:
    from affidavit.core.canonical import canonical_parsed_exact

    values = [{"at": "2026-11-22T13:00:29.176000Z", "n": i, "r": [1.5, "e-5"]} for i in range(50)]
    assert canonical_parsed_exact(values) == [rfc8785.dumps(v) for v in values]
    assert canonical_parsed_exact([]) == []


# parse reads most text with orjson; it must return exactly what json.loads with the I-JSON
# integer rule returns, and refuse exactly what it refuses.
def _reference_parse(data: bytes | str) -> Any:
    from affidavit.core.canonical import _parse_int

    return json.loads(data, parse_int=_parse_int)


def _outcome(fn: Any, data: bytes | str) -> Any:
    try:
        value = fn(data)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return "refused"
    # type-aware: 5.0 is not 5, True is not 1, NaN equals itself here
    return json.dumps(value, sort_keys=True, allow_nan=True) + repr(type(value))


_JSON_TEXT = st.one_of(
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.recursive(
        st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
        max_leaves=8,
    ).map(json.dumps),
    st.text(alphabet='{}[]",:0123456789.eE+-tfnaulrsNIy \\\\u\n\x00\ud800', max_size=20),
)


@settings(max_examples=examples(500, 10000), deadline=None)
@given(_JSON_TEXT, st.booleans())
def test_parse_agrees_with_the_reference_parser(text: str, as_bytes: bool) -> None:
    data: bytes | str = text.encode("utf-8", "surrogatepass") if as_bytes else text
    assert _outcome(parse, data) == _outcome(_reference_parse, data)


@pytest.mark.parametrize(
    "text",
    [
        "9007199254740993",
        '{"n": 123456789012345678901}',
        "1e400",
        "NaN",
        '"\\ud800"',
        '{"a": 1, "a": 2}',
        "-0",
        "[1.5, 2.0, -0.0]",
        '{"h": "0123456789012345678"}',
        "\ufeff[1]",
    ],
)
def test_parse_edge_cases_agree_with_the_reference_parser(text: str) -> None:
    for data in (text, text.encode("utf-8", "surrogatepass")):
        assert _outcome(parse, data) == _outcome(_reference_parse, data)
