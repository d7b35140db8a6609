"""Untrusted JSON in a pack: parsing with the exact reason of a failure, and canonical hashes
that fail as a check (:class:`~affidavit.packs._state.Fail`) instead of raising."""

from __future__ import annotations

import json
from typing import Any

import orjson

from affidavit.core.canonical import DuplicateKeyError, canonical, unique_pairs
from affidavit.core.errors import AffidavitError
from affidavit.packs import _format as F
from affidavit.packs._state import Fail


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _duplicate(name: str, exc: DuplicateKeyError) -> Fail:
    return Fail(f"{name}: key {exc.key!r} appears twice in one object")


def unique(data: bytes, value: Any, what: str) -> Any:
    """``value``, which orjson parsed from ``data``, when ``data`` gives no key twice in one
    object; :class:`Fail` naming ``what`` and the key otherwise. Parsers keep the last (or the
    first) value of a repeated key: two verifiers of one signed file could read different
    values, so a pack must not have one.

    Bytes written as the value's compact form with sorted keys (canonical JSON, as export
    writes every file but the manifest, is that in all but rare number forms) hold one member
    per key: compared in C. Anything else is parsed once more, the objects' keys checked."""
    if not isinstance(value, dict | list):
        return value
    try:
        if orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == data.strip():
            return value
    except orjson.JSONEncodeError:
        pass
    try:
        json.loads(data, object_pairs_hook=unique_pairs, parse_constant=_reject_constant)
    except DuplicateKeyError as exc:
        raise _duplicate(what, exc) from None
    except (ValueError, RecursionError):
        pass  # (orjson read it; json's own refusals are not this check's)
    return value


def loads(data: bytes, what: str) -> Any:
    """Parse ``data``; :class:`Fail` naming ``what`` and the reason when it is not UTF-8 JSON
    or gives a key twice in one object."""
    try:
        value = orjson.loads(data)  # fast path; anything it refuses gets the exact reason below
    except orjson.JSONDecodeError:
        pass
    else:
        return unique(data, value, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Fail(f"{what}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=unique_pairs)
    except DuplicateKeyError as exc:
        raise _duplicate(what, exc) from None
    except (ValueError, RecursionError) as exc:
        raise Fail(f"{what}: invalid JSON ({str(exc)[:200]})") from None


def parse(data: bytes, what: str) -> tuple[Any, bool]:
    """:func:`loads`, and whether orjson read it (then it holds no NaN, infinity or lone
    surrogate: :func:`~affidavit.core.canonical.canonical_parsed_all` applies)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return loads(data, what), False
    return unique(data, value, what), True


def loads_lines(data: bytes, name: str) -> tuple[list[Any], bool]:
    """The values of the non-blank lines of the JSON-lines file ``name``, and whether orjson
    read them all (then they hold no NaN, infinity, lone surrogate or integer beyond 64 bits:
    see :func:`canonicalizable`); :class:`Fail` with the reason of the first line that is not
    UTF-8 JSON (numbered from 1, blank lines counted)."""
    lines = list(filter(bytes.strip, data.split(b"\n")))
    try:
        # one C-level pass when every line is JSON orjson reads (as written by export)
        values = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:
        return loads_each_line(data, name), False
    # each line written as its value's compact sorted form gives no key twice (export's lines
    # are canonical JSON): one C-level pass; any other line is checked on its own
    option = orjson.OPT_SORT_KEYS
    try:
        same = list(map(bytes.__eq__, map(lambda v: orjson.dumps(v, option=option), values), lines))
    except orjson.JSONEncodeError:
        same = [False] * len(lines)
    if not all(same):
        numbers = [n for n, line in enumerate(data.split(b"\n"), start=1) if line.strip()]
        for number, line, value, ok in zip(numbers, lines, values, same, strict=True):
            if not ok:
                unique(line, value, f"{name} line {number}")
    return values, True


def loads_each_line(data: bytes, name: str) -> list[Any]:
    """:func:`loads_lines` line by line with :func:`loads` (the reference it must agree with)."""
    return [
        loads(line, f"{name} line {number}")
        for number, line in enumerate(data.split(b"\n"), start=1)
        if line.strip()
    ]


def canonicalizable(values: list[Any]) -> bool:
    """Whether :func:`~affidavit.core.canonical.canonical` accepts each of ``values``, which
    orjson parsed — checked in one C-level pass. ``False`` means "not known": the caller then
    canonicalizes each value the full way.

    For parsed values canonicalization fails only on an integer beyond ±(2^53-1) or nesting too
    deep to walk; orjson's 53-bit mode refuses the first and anything nested deeper than 255
    levels. NaN, infinities and lone surrogates — which orjson would write as ``null`` or refuse
    — never come out of orjson's parser."""
    try:
        orjson.dumps(values, option=orjson.OPT_STRICT_INTEGER)
    except orjson.JSONEncodeError:
        return False
    return True


def hash_value(value: Any, what: str) -> str:
    """``sha256:`` + hex(SHA-256(JCS(value))); :class:`Fail` when it cannot be canonicalized."""
    try:
        return F.h(value)
    except (AffidavitError, RecursionError) as exc:
        raise Fail(f"{what}: cannot be canonicalized ({getattr(exc, 'message', exc)})") from None


def hex_value(value: Any) -> str:
    """hex(SHA-256(JCS(value))); :class:`Fail` when it cannot be canonicalized."""
    try:
        return F.sha256_hex(canonical(value))
    except (AffidavitError, RecursionError) as exc:
        raise Fail(f"cannot be canonicalized ({getattr(exc, 'message', exc)})") from None
