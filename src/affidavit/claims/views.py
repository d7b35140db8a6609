"""What an agent's trust log says about its claims: the verifications of one claim, and the
re-verifications flagged because they judged a claim otherwise than the one that counted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from affidavit.claims.model import TrustEntry
from affidavit.core.seal import Seal
from affidavit.store import trust_record_id

_SHOWN = ("verification_id", "verdict", "decided_by", "verifier_id", "at")


def _verified(entries: Sequence[TrustEntry]) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for entry in entries:
        if entry.type == "claim_verified" and isinstance(payload := entry.payload, dict):
            out.append((entry.version, payload))
    return out


def claim_verifications(entries: Sequence[TrustEntry], claim_id: str) -> list[dict[str, Any]]:
    """Every verification of ``claim_id`` in the trust log ``entries``, oldest first:
    ``{"verification_id", "verdict", "decided_by", "verifier_id", "at", "trust_log_version",
    "counted", "disagrees"}``."""
    return [
        {
            **{k: p.get(k) for k in _SHOWN},
            "trust_log_version": version,
            "counted": bool(p.get("counted", p.get("verdict") != "error")),
            "disagrees": bool(p.get("disagrees", False)),
        }
        for version, p in _verified(entries)
        if p.get("claim_id") == claim_id
    ]


def disagreements(entries: Sequence[TrustEntry]) -> list[dict[str, Any]]:
    """The flagged re-verifications of the trust log ``entries``, oldest first:
    ``{"claim_id", "verification_id", "verdict", "counted_verification_id",
    "counted_verdict", "trust_log_version"}``."""
    return [
        {
            "claim_id": p.get("claim_id"),
            "verification_id": p.get("verification_id"),
            "verdict": p.get("verdict"),
            "counted_verification_id": p.get("counted_verification_id"),
            "counted_verdict": p.get("counted_verdict"),
            "trust_log_version": version,
        }
        for version, p in _verified(entries)
        if p.get("disagrees") is True
    ]


def record_ids_to_check(agent_id: str, entries: int, seal: Seal | None) -> list[str]:
    """The transparency-log record ids a trust-log check looks up: the latest seal's, and the
    one a longer log would have sealed."""
    longest = max(entries, seal.event_count if seal is not None else 0)
    ids = [trust_record_id(agent_id, longest + 1)]
    if seal is not None:
        ids.append(seal.job_id)
    return ids
