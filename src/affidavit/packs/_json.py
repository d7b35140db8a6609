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
