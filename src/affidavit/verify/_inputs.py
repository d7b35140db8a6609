"""Exported events (``verify_events``' input) as the rows the fold reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from affidavit.core.canonical import canonical_of_parsed
from affidavit.core.errors import AffidavitError, VerificationError
from affidavit.store import StoredEvent
from affidavit.verify._fold import LogFold


def _foreign(fold: LogFold, version: Any, event_type: Any, job_id: Any) -> None:
    fold.violate(
        "payload",
        version,
        f"{event_type!s}: the event belongs to job {job_id!a}, not {fold.job_id!a}",
    )


def chained(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def event_job_id(event: Any) -> str | None:
    if isinstance(event, StoredEvent):
        return event.job_id
    if isinstance(event, Mapping):
        value = event.get("job_id")
        return value if isinstance(value, str) else None
    return None


def event_parts(
    event: Any, position: int, fold: LogFold
) -> tuple[int, str, str, bytes, str | None]:
    """One exported event as a row; an event of another job is reported to ``fold`` (before
    the fold reads it, so that the first violation is still the first reported)."""
    if isinstance(event, StoredEvent):
        if event.job_id != fold.job_id:
            _foreign(fold, event.version, event.type, event.job_id)
        return event.version, event.event_id, event.type, event.payload_bytes, event.chain_hash
    if not isinstance(event, Mapping):
        raise VerificationError(f"event #{position} is not an object")
    if "job_id" in event and event["job_id"] != fold.job_id:
        _foreign(fold, event.get("version"), event.get("type"), event["job_id"])
    try:
        version, event_id, event_type = event["version"], event["event_id"], event["type"]
        payload = event["payload"]
    except KeyError as exc:
        raise VerificationError(f"event #{position} lacks {exc.args[0]!r}") from None
    if type(version) is not int or not isinstance(event_id, str) or not isinstance(event_type, str):
        raise VerificationError(f"event #{position}: version, event_id or type is malformed")
    if isinstance(payload, bytes | bytearray):
        payload_bytes = bytes(payload)
    else:
        try:
            payload_bytes = canonical_of_parsed(payload)
        except AffidavitError as exc:
            raise VerificationError(f"event #{position}: payload: {exc.message}") from None
    chain_hash = event.get("chain_hash")
    return (
        version,
        event_id,
        event_type,
        payload_bytes,
        chain_hash if isinstance(chain_hash, str) else None,
    )
