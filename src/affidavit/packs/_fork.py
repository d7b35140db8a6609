"""The reused prefix of a fork's pack (``pack verify FORK [--source SOURCE_PACK]``;
docs/verification.md, "Forks").

A fork's ``job_created`` names its source job, the hash of the source's seal and each reused
step's recorded result. Its pack proves its own record; the prefix it copied is the source's
only by reference. So, for a pack whose job is a fork:

(1) without the source's pack, the details say ``"status": "unverified"`` and why — the
    prefix is never passed silently;
(2) with it, the source's pack must verify MATCH, be the named source job, carry the seal
    whose hash the fork recorded, and hold each copied result for its step
    (:func:`affidavit.verify.check_reuse`, the same check ``affidavit verify`` makes against
    the store); anything else is the fork pack's INTEGRITY_FAIL.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.core.errors import AffidavitError
from affidavit.core.seal import Seal
from affidavit.packs import _format as F
from affidavit.packs._files import read
from affidavit.store import StoredEvent

UNCHECKED = (
    "source not checked: the pack holds the fork's own record, and the steps it reused are "
    "the source job's by reference; verify with --source SOURCE_PACK (the source's pack), or "
    "run `affidavit verify` where the database holds the source"
)


def forked_from(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``forked_from`` of a pack's (verified) events; ``None`` for a job that is no fork."""
    first = events[0] if events and isinstance(events[0], dict) else {}
    payload = first.get("payload") if first.get("type") == "job_created" else None
    found = payload.get("forked_from") if isinstance(payload, dict) else None
    return found if isinstance(found, dict) else None


def pack_events(pack: Path, limit: int) -> list[dict[str, Any]]:
    """The event objects of a pack's ``events.ndjson``.

    Raises:
        Fail: the file cannot be read.
        ValueError: a line is not JSON.
    """
    return [
        orjson.loads(line) for line in read(pack / F.EVENTS, F.EVENTS, limit).splitlines() if line
    ]


def first_event(pack: Path, limit: int) -> list[dict[str, Any]]:
    """The first event object of a pack's ``events.ndjson`` (a list of at most one), read
    without the rest: all :func:`forked_from` looks at.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a regular file, or the line is not JSON.
    """
    path = pack / F.EVENTS
    if not path.is_file():  # (as :func:`read` refuses it)
        raise ValueError("missing")
    with path.open("rb") as events:
        line = events.readline(limit)
    return [orjson.loads(line)] if line.strip() else []


def fork_details(
    forked: dict[str, Any],
    source: Path | None,
    *,
    trusted_keys: Iterable[bytes | str] | None,
    max_file_bytes: int,
) -> tuple[dict[str, Any], str | None]:
    """The ``fork`` details of a fork's pack, and the error that fails it (``None``: none)."""
    doc: dict[str, Any] = {
        "source_job_id": forked.get("job_id"),
        "step": forked.get("step"),
        "seal_hash": forked.get("seal_hash"),
    }
    if source is None:  # (1)
        return {**doc, "status": "unverified", "reason": UNCHECKED}, None
    problem = _source_problem(forked, source, trusted_keys, max_file_bytes)  # (2)
    if problem is None:
        return {**doc, "status": "verified", "source_pack": str(source)}, None
    return {**doc, "status": "failed", "problem": problem}, f"fork: {problem}"


def _source_problem(
    forked: dict[str, Any],
    source: Path,
    trusted_keys: Iterable[bytes | str] | None,
    max_file_bytes: int,
) -> str | None:
    from affidavit.packs.verify import verify_pack
    from affidavit.verify import check_reuse

    verdict = verify_pack(source, trusted_keys=trusted_keys, max_file_bytes=max_file_bytes)
    if not verdict.ok:
        return f"the source's pack {str(source)!r} is {verdict.verdict}"
    try:
        events = pack_events(source, max_file_bytes)
        seal = _pack_seal(source, max_file_bytes)
        job_id = _job_of(source, max_file_bytes)
        if job_id != forked.get("job_id"):
            return f"the source's pack is job {job_id}, not the source {forked.get('job_id')}"
        if seal is None:
            return "the source's pack carries no seal"
        stored = [
            StoredEvent(
                str(job_id),
                int(e["version"]),
                str(e["event_id"]),
                str(e["type"]),
                canonical(e["payload"]),
                str(e["chain_hash"]),
            )
            for e in events
        ]
        return check_reuse(forked, stored, canonical_sha256(seal.to_dict()))
    except (AffidavitError, KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"the source's pack cannot be read: {type(exc).__name__} {exc}"


def _receipts(pack: Path, limit: int) -> list[Any]:
    lines = read(pack / F.RECEIPTS, F.RECEIPTS, limit).splitlines()
    return [orjson.loads(line) for line in lines if line.strip()]


def _pack_seal(pack: Path, limit: int) -> Seal | None:
    for r in _receipts(pack, limit):
        if isinstance(r, dict) and r.get("type") == F.SEAL and isinstance(r.get("seal"), dict):
            return Seal.from_dict(r["seal"])
    return None


def _job_of(pack: Path, limit: int) -> Any:
    first = _receipts(pack, limit)
    return first[0].get("run_id") if first and isinstance(first[0], dict) else None
