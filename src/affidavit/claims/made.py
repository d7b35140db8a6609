"""Claims recorded by the agent that makes them (the ``claims`` table, migration 0011).

An agent records its own claim — what it says and the command that checks it — and gets a
claim id; another agent verifies that claim by id. The verifier never writes what someone else
claimed. Rows are append-only (triggers), and the claim's content is stored as canonical JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.claims.model import is_ident
from affidavit.core.canonical import canonical, parse
from affidavit.core.errors import NotFound, TamperedRecordError
from affidavit.store import Transaction


class ClaimNotFound(NotFound):
    code = "claim_not_found"
    default_hint = "Record the claim first (POST /api/claims, `affidavit claims make`)."


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim as its agent recorded it."""

    claim_id: str
    agent_id: str
    namespace: str
    claim_type: str
    claim: dict[str, Any]
    command: str
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim_id": self.claim_id,
            "agent_id": self.agent_id,
            "namespace": self.namespace,
            "claim_type": self.claim_type,
            "claim": self.claim,
            "command": self.command,
            "created_at": self.created_at,
        }


def insert(tx: Transaction, claim: Claim) -> None:
    tx.claim_insert(
        (
            claim.claim_id,
            claim.agent_id,
            claim.namespace,
            claim.claim_type,
            canonical(claim.claim),
            claim.command,
            claim.created_at,
        ),
    )


def get(tx: Transaction, claim_id: str) -> Claim | None:
    """The claim, or ``None``.

    Raises:
        TamperedRecordError: its stored content is not a JSON object.
    """
    if not is_ident(claim_id):
        return None
    row = tx.claim_row(claim_id)
    return _claim(row) if row is not None else None


def _claim(row: Sequence[Any]) -> Claim:
    try:
        content = parse(bytes(row[4]))
    except (ValueError, TypeError, RecursionError):
        content = None
    if not isinstance(content, dict):
        raise TamperedRecordError(f"claim {row[0]}", "the stored claim is not a JSON object")
    return Claim(row[0], row[1], row[2], row[3], content, row[5], row[6])
