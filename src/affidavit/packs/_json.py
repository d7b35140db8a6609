"""Untrusted JSON in a pack: parsing with the exact reason of a failure, and canonical hashes
that fail as a check (:class:`~affidavit.packs._state.Fail`) instead of raising."""

from __future__ import annotations

import json
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
    surrogate: :func:`~affidavit.core.canonical.canonical_parsed_all` applies)."""
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
