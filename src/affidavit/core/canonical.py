"""Canonical JSON (RFC 8785, JCS) and the hash helpers built on it.

``canonical(value)`` is the only way affidavit turns a value into bytes that get hashed or
stored. The bytes are exactly what the ``rfc8785`` package produces; for the common case
(no floats, no object keys outside the Basic Multilingual Plane) ``orjson`` with sorted keys
produces identical bytes several times faster, which a property test checks against ``rfc8785``
on generated values.

Values that JCS cannot represent are rejected with :class:`CanonicalizationError` naming the
JSON path of the offending value: non-string object keys, integers beyond ±(2^53−1), NaN and
infinities, bytes, lone surrogates, and any non-JSON type.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

import orjson
import rfc8785

from affidavit.core.errors import CanonicalizationError

MAX_SAFE_INTEGER = 2**53 - 1

# orjson with sorted keys writes JCS for every value the walk below admits to the fast path:
# no whitespace, UTF-8 without escaping beyond what JSON requires, integers as decimals.
_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Rejected(Exception):
    """Raised at the offending leaf; containers on the way up prepend their key or index."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.parts: list[str | int] = []
        self.in_key = False  # the offending thing is an object key, not a member value


def _reject_scalar(value: Any) -> bool:
    """The slow path of :func:`_check` for anything that is not str/bool/None/int/dict/list."""
    t = type(value)
    if t is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return True
        raise _Rejected(f"integer {value} is outside ±(2^53-1)")
    if t is float:
        if math.isfinite(value):
            # orjson writes a double as the shortest round-trip digits, as JCS does; the two
            # differ only for integral doubles ("5.0" vs "5") and below 1e-5 (exponent vs fixed
            # notation), which take the rfc8785 path. Durations and scores stay on the fast one.
            return not value.is_integer() and abs(value) >= 1e-4
        raise _Rejected(f"number {value!r} is not finite")
    # Subclasses of the JSON types (str enums, int enums) serialize as their base type.
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return _reject_scalar(int(value))
    if isinstance(value, float):
        return _reject_scalar(float(value)) and False
    if isinstance(value, dict | list | tuple):
        return _check(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raise _Rejected("bytes are not JSON; encode them (for example as base64 text) first")
    raise _Rejected(f"a value of type {type(value).__name__} is not JSON")


def _check(value: Any) -> bool:
    """Raise :class:`_Rejected` for a non-representable value; return whether the fast
    encoder is byte-identical to JCS for it (no floats, no astral-plane keys).

    Leaves are tested inline (no call per leaf): this walk runs on every append.
    """
    t = type(value)
    fast = True
    if t is dict:
        key: Any = None
        try:
            for key, item in value.items():
                if type(key) is not str and not isinstance(key, str):
                    bad_key = _Rejected(f"object key {key!r} is not a string")
                    bad_key.in_key = True
                    raise bad_key
                if not key.isascii() and any(ord(c) > 0xFFFF for c in key):
                    fast = False  # JCS sorts keys by UTF-16 code units, Python by code points
                ti = type(item)
                if ti is str or ti is bool or item is None:
                    continue
                if ti is int:
                    if -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                        continue
                    raise _Rejected(f"integer {item} is outside ±(2^53-1)")
                if not (_check(item) if ti is dict or ti is list else _reject_scalar(item)):
                    fast = False
        except _Rejected as exc:
            if exc.in_key:
                exc.in_key = False
            else:
                exc.parts.append(key)
            raise
        return fast
    if t is list or t is tuple:
        index = -1
        try:
            for item in value:
                index += 1
                ti = type(item)
                if ti is str or ti is bool or item is None:
                    continue
                if ti is int:
                    if -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                        continue
                    raise _Rejected(f"integer {item} is outside ±(2^53-1)")
                if not (_check(item) if ti is dict or ti is list else _reject_scalar(item)):
                    fast = False
        except _Rejected as exc:
            exc.parts.append(index)
            raise
        return fast
    if t is str or t is bool or value is None:
        return True
    return _reject_scalar(value)


def _with_integral_doubles_as_ints(value: Any) -> Any:
    """A copy of an accepted value with every integral double within ±(2^53-1) as an ``int``
    (JCS writes both alike: ``5.0`` is ``5``), or ``None`` when something else keeps it off the
    fast encoder (a double below 1e-4, a key outside the Basic Multilingual Plane). One float
    such as ``backoff_seconds: 1.0`` would otherwise send a whole plan to the slow encoder."""
    t = type(value)
    if isinstance(value, float):
        number = float(value)
        if number.is_integer() and abs(number) <= MAX_SAFE_INTEGER:
            return int(number)
        return number if _reject_scalar(number) else None
    if t is dict or isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not key.isascii() and any(ord(c) > 0xFFFF for c in key):
                return None
            converted = _with_integral_doubles_as_ints(item)
            if converted is None and item is not None:
                return None
            out[key] = converted
        return out
    if t is list or t is tuple or isinstance(value, list | tuple):
        items = []
        for item in value:
            converted = _with_integral_doubles_as_ints(item)
            if converted is None and item is not None:
                return None
            items.append(converted)
        return items
    return value


def json_path(parts: list[str | int]) -> str:
    """Render collected path parts (innermost first) as ``$.a[0]["b c"]``."""
    out = ["$"]
    for part in reversed(parts):
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif isinstance(part, str) and _IDENT.match(part):
            out.append(f".{part}")
        else:
            out.append(f"[{json.dumps(part) if isinstance(part, str) else repr(part)}]")
    return "".join(out)


def _find_lone_surrogate(value: Any, parts: list[str | int]) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        for key, item in value.items():
            if _find_lone_surrogate(key, []) or _find_lone_surrogate(item, parts):
                parts.append(key)
                return True
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if _find_lone_surrogate(item, parts):
                parts.append(index)
                return True
    return False


def canonical(value: Any) -> bytes:
    """Return the RFC 8785 canonical JSON bytes of ``value``.

    Raises:
        CanonicalizationError: the value (at the reported JSON path) is not representable.
    """
    try:
        fast = _check(value)
    except _Rejected as exc:
        raise CanonicalizationError(exc.reason, path=json_path(exc.parts)) from None
    try:
        if fast:
            return orjson.dumps(value, option=_ORJSON_OPTIONS)
        converted = _with_integral_doubles_as_ints(value)
        if converted is not None:
            return orjson.dumps(converted, option=_ORJSON_OPTIONS)
        return bytes(rfc8785.dumps(value))
    except (UnicodeEncodeError, orjson.JSONEncodeError, rfc8785.CanonicalizationError) as exc:
        parts: list[str | int] = []
        if _find_lone_surrogate(value, parts):
            raise CanonicalizationError(
                "string contains a lone surrogate (not valid Unicode)", path=json_path(parts)
            ) from None
        raise CanonicalizationError(str(exc)) from exc


# Where orjson's sorted output and JCS differ for parsed values (property-tested against
# rfc8785): a number in exponent form or an integral double ("5.0", JCS "5"), and characters
# outside the Basic Multilingual Plane (JCS orders keys by UTF-16 code units). A number token
# starts a value: at the start, after ":", "," or "[", or after the "\n" that joins values in
# canonical_parsed_all. Strings that look alike only cost the full encoder. Fixed-notation
# fractions agree: both write the shortest round-trip digits, and orjson switches to exponents
# earlier (below 1e-5) than JCS (1e-6).
_DIFFERENT_NUMBER = re.compile(rb"(?:^|[:,\[\n])-?[0-9]+(?:(?:\.[0-9]+)?e[-+]|\.0(?![0-9]))")
_POINT_ZERO = re.compile(rb"\.0[,}\]\n]")
_ASTRAL = re.compile(rb"[\xf0-\xf7]")


def _is_jcs(data: bytes) -> bool:
    """Whether orjson's sorted output ``data`` (values joined by "\n") is already JCS."""
    # cheap scans first: each such number holds "e-", "e+" or ".0" before a delimiter
    if (
        b"e-" in data
        or (b"+" in data and b"e+" in data)
        or _POINT_ZERO.search(data) is not None
        or data.endswith(b".0")
    ) and _DIFFERENT_NUMBER.search(data) is not None:
        return False
    return data.isascii() or _ASTRAL.search(data) is None


def canonical_parsed(value: Any) -> bytes:
    """:func:`canonical` for a value a JSON parser returned (dicts, lists, str, int, float, bool,
    None — no NaN or infinity), without the Python walk over it: orjson's sorted output is the
    JCS bytes unless it holds a number JCS writes otherwise or a character outside the Basic
    Multilingual Plane, and only then is the full :func:`canonical` used.

    Raises:
        CanonicalizationError: the value is not representable (an integer beyond ±(2^53-1)).
    """
    try:
        fast = orjson.dumps(value, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:  # an integer beyond 2^53, deep nesting: the full way
        return canonical(value)
    return fast if _is_jcs(fast) else canonical(value)


def canonical_parsed_all(values: list[Any]) -> list[bytes]:
    """``[canonical_parsed(v) for v in values]`` in a few C-level passes: one check over all the
    values' orjson output, then per value only when that finds something.

    Raises:
        CanonicalizationError, RecursionError: as :func:`canonical` does, for the first value it
            rejects.
    """
    try:
        out = [orjson.dumps(value, option=_ORJSON_OPTIONS) for value in values]
    except orjson.JSONEncodeError:
        return [canonical(value) for value in values]
    if _is_jcs(b"\n".join(out)):
        return out
    return [
        data if _is_jcs(data) else canonical(value) for value, data in zip(values, out, strict=True)
    ]


def _parse_int(text: str) -> int | float:
    value = int(text)
    # JCS numbers are IEEE doubles: an integral double beyond 2^53 is written without a
    # fraction, so read it back as the double it was.
    return value if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER else float(value)


def parse(data: bytes | str) -> Any:
    """Parse JSON as I-JSON does: integers beyond ±(2^53-1) are read as doubles.

    ``canonical(parse(canonical(x))) == canonical(x)`` for every accepted ``x``.
    """
    return json.loads(data, parse_int=_parse_int)


def canonical_text(value: Any) -> str:
    """``canonical(value)`` decoded as UTF-8."""
    return canonical(value).decode("utf-8")


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256 of ``data`` (the bare form used by Verification Mode)."""
    return hashlib.sha256(data).hexdigest()


def sha256_prefixed(data: bytes) -> str:
    """``sha256:<hex>``, the form used in proof-pack receipts and contracts."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_sha256(value: Any) -> str:
    """Hex SHA-256 of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical(value)).hexdigest()
