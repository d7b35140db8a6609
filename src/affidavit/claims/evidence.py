"""Evidence that verifies: each stored evidence body against its id, and the evidence rows
against the agent's hash-chained trust log.

The database's triggers keep the evidence tables append-only, but whoever owns the database
can drop them. What they cannot do without being seen:

1. change an evidence body: its ``evidence_id`` is the SHA-256 of the stored bytes;
2. change the body *and* its id, or the verdict column: the trust log's ``claim_verified``
   entry (hash-chained, checked by :func:`affidavit.core.chain.check_stored_chain`) names the
   verification's evidence id and verdict;
3. add or remove a verification: every evidence row has exactly one ``claim_verified`` entry,
   and every entry one row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from affidavit.claims.model import TrustEntry
from affidavit.core.canonical import sha256_hex
from affidavit.core.errors import TamperedRecordError

MAX_PROBLEMS = 10


def body_problem(evidence_id: str, body: bytes) -> str | None:
    """Why ``body`` is not the evidence ``evidence_id`` names, or ``None``."""
    if sha256_hex(body) != evidence_id:
        return "the stored evidence is not what its evidence_id names (its SHA-256 differs)"
    return None


def check_body(where: str, evidence_id: str, body: bytes) -> None:
    """Raises :class:`TamperedRecordError` naming ``where`` when the body does not match."""
    problem = body_problem(evidence_id, body)
    if problem is not None:
        raise TamperedRecordError(where, problem)


def logged(entries: Iterable[TrustEntry]) -> dict[str, Mapping[str, Any]]:
    """The ``claim_verified`` payloads of a trust log by verification id."""
    out: dict[str, Mapping[str, Any]] = {}
    for entry in entries:
        if entry.type == "claim_verified":
            payload = entry.payload
            if isinstance(payload, dict):
                out[str(payload.get("verification_id"))] = payload
    return out


def row_problem(
    verification_id: str,
    evidence_id: str,
    body: bytes,
    verdict: str,
    doc: Mapping[str, Any],
    entry: Mapping[str, Any] | None,
) -> str | None:
    """What is wrong with one evidence row, checked against its trust log entry."""
    problem = body_problem(evidence_id, body)
    if problem is not None:
        return problem
    if entry is None:
        return "the trust log has no entry for this verification"
    if entry.get("evidence_id") != evidence_id:
        return f"the trust log records evidence {entry.get('evidence_id')}, the row holds another"
    if doc.get("verdict") != verdict or entry.get("verdict") != verdict:
        return (
            f"the verdict column says {verdict!r}, the evidence {doc.get('verdict')!r} and the "
            f"trust log {entry.get('verdict')!r}"
        )
    return None


def cross_check(
    agent_id: str,
    rows: Sequence[tuple[str, str, bytes, str, Mapping[str, Any]]],
    entries: Iterable[TrustEntry],
) -> list[str]:
    """Every problem (the first :data:`MAX_PROBLEMS`) between an agent's evidence rows
    ``(verification_id, evidence_id, body, verdict, parsed body)`` and its trust log."""
    expected = logged(entries)
    problems: list[str] = []
    for verification_id, evidence_id, body, verdict, doc in rows:
        problem = row_problem(
            verification_id, evidence_id, body, verdict, doc, expected.pop(verification_id, None)
        )
        if problem is not None:
            problems.append(f"agent {agent_id}, verification {verification_id}: {problem}")
    for verification_id in expected:
        problems.append(
            f"agent {agent_id}, verification {verification_id}: in the trust log, but its "
            "evidence record is missing"
        )
    return problems[:MAX_PROBLEMS]
