"""Untrusted JSON in a pack: parsing with the exact reason of a failure, and canonical hashes
that fail as a check (:class:`~affidavit.packs._state.Fail`) instead of raising."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from affidavit.core.canonical import canonical
from affidavit.core.errors import AffidavitError
from affidavit.packs import _format as F
from affidavit.packs._state import Fail


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes, what: str) -> Any:
    """Parse ``data``; :class:`Fail` naming ``what`` and the reason when it is not UTF-8 JSON."""
    try:
        return orjson.loads(data)  # fast path; anything it refuses gets the exact reason below
    except orjson.JSONDecodeError:
        pass
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Fail(f"{what}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise Fail(f"{what}: invalid JSON ({str(exc)[:200]})") from None


def parse(data: bytes, what: str) -> tuple[Any, bool]:
    """:func:`loads`, and whether orjson read it (then it holds no NaN, infinity or lone
    surrogate: :func:`canonical_all` applies)."""
    try:
        return orjson.loads(data), True
    except orjson.JSONDecodeError:
        return loads(data, what), False


def loads_lines(data: bytes, name: str) -> tuple[list[Any], bool]:
    """The values of the non-blank lines of the JSON-lines file ``name``, and whether orjson
    read them all (then they hold no NaN, infinity, lone surrogate or integer beyond 64 bits:
    see :func:`canonicalizable`); :class:`Fail` with the reason of the first line that is not
    UTF-8 JSON (numbered from 1, blank lines counted)."""
    try:
        # one C-level pass when every line is JSON orjson reads (as written by export)
        return list(map(orjson.loads, filter(bytes.strip, data.split(b"\n")))), True
    except orjson.JSONDecodeError:
        return loads_each_line(data, name), False


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


_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER
# Where orjson's sorted output and JCS differ (property-tested against rfc8785): a number in
# exponent form or an integral double ("5.0", JCS "5"), and characters outside the Basic
# Multilingual Plane (JCS orders keys by UTF-16 code units). A number token starts a value: at
# the start, after ":", "," or "[", or after the "\n" that joins values below. Strings that look
# alike only cost the full encoder. Fixed-notation fractions agree: both write the shortest
# round-trip digits, and orjson switches to exponents earlier (below 1e-5) than JCS (1e-6).
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


def canonical_all(values: list[Any]) -> list[bytes]:
    """``[canonical(v) for v in values]`` for values holding no NaN or infinity (what a JSON
    parser returns; orjson would write those as ``null``), in a few C-level passes: orjson's
    sorted output is JCS unless it holds a number in a form JCS writes otherwise or a character
    outside the Basic Multilingual Plane — one check over all values, then per value, and
    :func:`~affidavit.core.canonical.canonical` for those that do.

    Raises:
        CanonicalizationError, RecursionError: as ``canonical`` does, for the first value it
            rejects.
    """
    try:
        out = [orjson.dumps(value, option=_SORTED) for value in values]
    except orjson.JSONEncodeError:  # an integer beyond 2^53, deep nesting: the full way
        return [canonical(value) for value in values]
    if _is_jcs(b"\n".join(out)):
        return out
    return [
        data if _is_jcs(data) else canonical(value) for value, data in zip(values, out, strict=True)
    ]


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
