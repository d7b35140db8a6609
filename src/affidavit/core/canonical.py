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
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


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
    # Subclasses of the containers (OrderedDict, defaultdict, named tuples) are checked as
    # their base type (``_check`` takes exact types only) and written by the slow path.
    if isinstance(value, dict):
        _check(dict(value))
        return False
    if isinstance(value, list | tuple):
        _check(list(value))
        return False
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
                if type(key) is not str:
                    if not isinstance(key, str):
                        bad_key = _Rejected(f"object key {key!r} is not a string")
                        bad_key.in_key = True
                        raise bad_key
                    fast = False  # orjson refuses keys that subclass str (a StrEnum member)
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
            out[str.__str__(key)] = converted  # a StrEnum key as its value
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
        if "Recursion limit" in str(exc):  # orjson's
            raise _too_deep(MAX_DEPTH) from None
        raise CanonicalizationError(str(exc)) from exc


# How deep canonical JSON is written: orjson (the encoder of the common case) refuses a value
# nested more than this many arrays and objects deep.
MAX_DEPTH = 254
# A value a job records (its input, a step's result or output, a signal's payload, a resumed
# step's result) is also written inside other values: a step's output inside the job's output
# inside the job_completed event. It must fit there too.
RECORDED_LEVELS = 2


def canonical_nested(value: Any, levels: int = RECORDED_LEVELS) -> bytes:
    """``canonical(value)`` for a value that is also written ``levels`` arrays or objects
    deeper, inside other values: refused when it could not be canonicalized there, so that it
    is refused where it enters (with a clear reason) instead of where it is written again.

    Raises:
        CanonicalizationError: the value is not representable (its JSON path named), or is
            nested too deeply to be written ``levels`` levels deeper.
    """
    wrapped = value
    for _ in range(levels):
        wrapped = [wrapped]
    try:
        data = canonical(wrapped)
        return data[levels:-levels] if levels else data  # JCS([v]) is "[" + JCS(v) + "]"
    except (CanonicalizationError, RecursionError):
        pass
    try:
        canonical(value)
    except CanonicalizationError as exc:
        if not exc.reason.startswith(_TOO_DEEP):
            raise  # the value's own fault, named with its path
    except RecursionError:  # deeper than the check can walk at all
        pass
    raise _too_deep(MAX_DEPTH - levels)


_TOO_DEEP = "nested too deeply"


def _too_deep(depth: int) -> CanonicalizationError:
    return CanonicalizationError(
        f"{_TOO_DEEP}: arrays and objects may hold one another at most {depth} levels deep "
        "in a value that is recorded",
        path="$",
        hint="Flatten the value, or record the deep part as text (serialized JSON) or a reference.",
    )


# Where orjson's sorted output and JCS differ for parsed values (property-tested against
# rfc8785): a number in exponent form or an integral double ("5.0", JCS "5"), and characters
# outside the Basic Multilingual Plane (JCS orders keys by UTF-16 code units). A number token
# starts a value: at the start, after ":", "," or "[", or after the "\n" that joins values in
# canonical_parsed_all. Strings that look alike only cost the full encoder. Fixed-notation
# fractions agree: both write the shortest round-trip digits, and orjson switches to exponents
# earlier (below 1e-5) than JCS (1e-6).
#
# The scan looks for the literal markers "e-", "e+" and ".0" (a C search each, which skips the
# many that sit inside strings: identifiers, UUIDs) and checks only around each hit that it ends
# a number token; a regular expression that starts at every delimiter costs ~40 ns per byte.
_DIGITS = frozenset(b"0123456789")
_TOKEN_STARTS = frozenset(b":,[\n")
_ASTRAL = re.compile(rb"[\xf0-\xf7]")
_DOT, _MINUS = ord("."), ord("-")


def _number_ends_at(data: bytes, end: int, fraction: bool) -> bool:
    """Whether ``data[:end]`` ends with a number token ``-?[0-9]+`` (``fraction``: with an
    optional ``.[0-9]+``) that starts a value."""
    i = end - 1
    while i >= 0 and data[i] in _DIGITS:
        i -= 1
    if i == end - 1:
        return False
    if fraction and i >= 0 and data[i] == _DOT:
        j = i - 1
        while j >= 0 and data[j] in _DIGITS:
            j -= 1
        if j == i - 1:
            return False
        i = j
    if i >= 0 and data[i] == _MINUS:
        i -= 1
    return i < 0 or data[i] in _TOKEN_STARTS


def has_exponent_number(data: bytes) -> bool:
    """Whether JSON text ``data`` holds a number in exponent form, ``-?[0-9]+(.[0-9]+)?e[-+]…``
    (RFC 8785 writes ``1e+21`` and ``1e-7`` so), as a value and not inside a string."""
    # "+" is rare (memchr finds its absence at once); "e-" is searched in full
    for marker in (b"e-", b"e+") if b"+" in data else (b"e-",):
        at = data.find(marker)
        while at != -1:
            if _number_ends_at(data, at, fraction=True):
                return True
            at = data.find(marker, at + 2)
    return False


def _has_different_number(data: bytes) -> bool:
    """A number JCS writes otherwise: ``-?[0-9]+(.[0-9]+)?e[-+]…`` or ``-?[0-9]+.0`` (not
    followed by a digit), starting a value."""
    if has_exponent_number(data):
        return True
    at = data.find(b".0")
    while at != -1:
        following = data[at + 2 : at + 3]
        if (not following or following[0] not in _DIGITS) and _number_ends_at(
            data, at, fraction=False
        ):
            return True
        at = data.find(b".0", at + 2)
    return False


def _is_jcs(data: bytes) -> bool:
    """Whether orjson's sorted output ``data`` (values joined by "\n") is already JCS."""
    if _has_different_number(data):
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
    exact = canonical_parsed_exact(values)
    return exact if exact is not None else [canonical_parsed(value) for value in values]


# canonical_parsed_exact writes all the values in one call, as one list with a gap string
# between them, and splits the output at the gaps: tens of thousands of separate orjson calls
# whose outputs are kept cost several times the writing itself (measured on 50,000 event
# payloads: 98 ms one call each, 14 ms as one list). A value may hold the gap string too, so
# the split is taken only when the gap's bytes occur exactly once per gap — its quotes are
# bare, which inside a value happens only where a string equals it (or ends in it after an
# escaped quote), and each such place adds one.
_GAP = "\x00affidavit\x00"
_GAP_JSON = b'"\\u0000affidavit\\u0000"'
_GAP_SEPARATOR = b"," + _GAP_JSON + b","


def canonical_parsed_exact(values: list[Any]) -> list[bytes] | None:
    """The JCS bytes of each parsed value when orjson writes every one of them exactly so,
    else ``None``. Then parsing those bytes gives back each value as it is (same types, no
    integral double turned integer), so a caller may use the values in place of re-parsing."""
    if not values:
        return []
    spaced: list[Any] = [_GAP] * (2 * len(values) - 1)
    spaced[::2] = values
    try:
        whole = orjson.dumps(spaced, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:  # an unsafe integer, nesting one level too deep: per value
        return None
    body = whole[1:-1]
    if body.count(_GAP_JSON) != len(values) - 1 or not _is_jcs(body):
        return None
    parts = body.split(_GAP_SEPARATOR)
    return parts if len(parts) == len(values) else None


def _parse_int(text: str) -> int | float:
    value = int(text)
    # JCS numbers are IEEE doubles: an integral double beyond 2^53 is written without a
    # fraction, so read it back as the double it was.
    return value if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER else float(value)


# An integer beyond ±(2^53-1) has at least 16 digits. Text without such a run of digits is
# read by orjson, which then returns what json.loads returns (property-tested); anything it
# refuses (NaN, lone surrogates, bytes that are not UTF-8, ...) goes to json.loads, which
# accepts or raises as before. The run is found by mapping digits to "1" and the rest to "0"
# (two C passes; a regular expression tries a match at every digit of every hex id).
_DIGITS_AS_ONES = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_SIXTEEN_DIGITS = b"1" * 16


def parse(data: bytes | str) -> Any:
    """Parse JSON as I-JSON does: integers beyond ±(2^53-1) are read as doubles.

    ``canonical(parse(canonical(x))) == canonical(x)`` for every accepted ``x``.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.translate(_DIGITS_AS_ONES).find(_SIXTEEN_DIGITS) < 0:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data, parse_int=_parse_int)


class DuplicateKeyError(ValueError):
    """JSON text that gives one key twice in an object, which ``json`` and orjson read as the
    last value given: refused where people write JSON (plan files, ``--input``, request
    bodies), so that no two readers of the same text can see different values."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} appears twice in one object")
        self.key = key


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An ``object_pairs_hook`` for ``json.loads``: the object, or :class:`DuplicateKeyError`."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return out


def loads_unique(text: str | bytes) -> Any:
    """``json.loads`` that refuses an object giving a key twice.

    Raises:
        ValueError: ``text`` is not JSON (``json.JSONDecodeError``), gives a key twice in one
            object (:class:`DuplicateKeyError`), or nests arrays and objects too deeply to be
            read (more levels than Python's recursion limit).
    """
    try:
        return json.loads(text, object_pairs_hook=unique_pairs)
    except RecursionError:
        raise ValueError("arrays and objects are nested too deeply to be read") from None


def unsafe_integers_as_doubles(value: Any) -> Any:
    """``value``, as a JSON parser returned it, with every integer beyond ±(2^53-1) read as
    the double it denotes — what :func:`parse` returns for the same text.

    JCS writes an integral double from 2^53 on without a fraction (``1.7e18`` as
    ``1700000000000000000``); orjson and ``json`` read those digits as an ``int``, which
    :func:`canonical` refuses, so a value parsed that way canonicalizes back to its bytes only
    through this. An integer too large for a double is kept (and refused).
    """
    t = type(value)
    if t is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        try:
            return float(value)
        except OverflowError:
            return value
    if t is dict:
        return {key: unsafe_integers_as_doubles(item) for key, item in value.items()}
    if t is list:
        return [unsafe_integers_as_doubles(item) for item in value]
    return value


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


def canonical_of_parsed(value: Any) -> bytes:
    """JCS of a value a JSON parser returned: :func:`canonical`, and where it refuses an
    integer beyond ±(2^53-1), that integer read as the double it denotes (see
    :func:`unsafe_integers_as_doubles`).

    Raises:
        CanonicalizationError: the value is not canonical JSON even so.
    """
    try:
        return canonical(value)
    except CanonicalizationError:
        return canonical(unsafe_integers_as_doubles(value))
