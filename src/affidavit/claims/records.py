"""The claims tables (migration 0004), read and written inside a store transaction.

``agents`` is the only mutable table (score and counters, updated under a row lock).
``claim_verifications`` and ``trust_log`` are append-only: the database itself refuses UPDATE
and DELETE (triggers), so evidence cannot be rewritten after the fact, even by hand. The SQL
is the store's (:mod:`affidavit.store._claims`); this module makes its rows the claims
layer's values and checks what a row may hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from affidavit.claims.model import Agent, Pattern, TrustEntry, is_ident, trust_entry_name
from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.errors import TamperedRecordError
from affidavit.core.events import utc_now
from affidavit.core.ids import new_event_id
from affidavit.store import Transaction
from affidavit.store.base import event_row_problem


def _agent(row: Sequence[Any]) -> Agent:
    return Agent(
        agent_id=row[0],
        namespace=row[1],
        role=row[2],
        trust_score=float(row[3]),
        verifications=int(row[4]),
        accurate_verifications=int(row[5]),
        error_verifications=int(row[6]),
        created_at=row[7],
        updated_at=row[8],
    )


def _pattern(row: Sequence[Any]) -> Pattern:
    return Pattern(
        pattern_id=row[0],
        owner_agent_id=row[1],
        namespace=row[2],
        access_level=row[3],
        name=row[4],
        success_count=int(row[5]),
        failure_count=int(row[6]),
        created_at=row[7],
    )


def _entry(row: Sequence[Any]) -> TrustEntry:
    """The entry of a ``trust_log`` row (its columns are laid out as an event row's).

    Raises:
        TamperedRecordError: the row holds a value of another type than the store writes.
    """
    problem = event_row_problem(row)
    if problem:
        raise TamperedRecordError(trust_entry_name(row[0], row[1]), problem)
    return TrustEntry(row[0], row[1], row[2], row[3], bytes(row[4]), row[5])


def _evidence(agent_id: str | None, row: Sequence[Any]) -> tuple[str, bytes]:
    """``(evidence_id, evidence bytes)`` of a ``claim_verifications`` row.

    Raises:
        TamperedRecordError: the row holds a value of another type than the store writes.
    """
    evidence_id, body = row[0], row[1]
    if not isinstance(evidence_id, str) or not isinstance(body, bytes | bytearray | memoryview):
        wrong = "evidence id" if not isinstance(evidence_id, str) else "evidence"
        raise TamperedRecordError(
            evidence_name(agent_id, str(evidence_id)), f"the {wrong} is of another type"
        )
    return evidence_id, bytes(body)


def evidence_name(agent_id: str | None, evidence_id: str) -> str:
    """How an error names a stored evidence record."""
    owner = "" if agent_id is None else f"agent {agent_id}, "
    return f"{owner}evidence {evidence_id}"


# --- agents ---------------------------------------------------------------------------------


def insert_agent(tx: Transaction, agent_id: str, namespace: str, role: str, score: float) -> bool:
    """Insert an agent; ``False`` if the id is taken (nothing written)."""
    return tx.agent_insert(agent_id, namespace, role, score, utc_now())


def get_agent(tx: Transaction, agent_id: str, *, for_update: bool = False) -> Agent | None:
    """The agent row, locked until the transaction ends when ``for_update`` (the store takes
    its backend's row lock). An id that no agent could have (see
    :func:`~affidavit.claims.model.check_ident`) is not looked up."""
    if not is_ident(agent_id):
        return None
    row = tx.agent_row(agent_id, for_update=for_update)
    return _agent(row) if row is not None else None


def list_agents(tx: Transaction, namespace: str | None) -> list[Agent]:
    return [_agent(r) for r in tx.agent_rows(namespace)]


def save_trust(
    tx: Transaction, agent: Agent, *, score: float, judged: bool, accurate: bool
) -> None:
    """Write the agent's new score and bump its counters (the row is locked by the caller)."""
    tx.agent_trust_update(agent.agent_id, score, judged=judged, accurate=accurate, now=utc_now())


# --- patterns -------------------------------------------------------------------------------


def insert_pattern(
    tx: Transaction,
    pattern_id: str,
    owner: str,
    namespace: str,
    access_level: str,
    name: str,
) -> bool:
    return tx.pattern_insert((pattern_id, owner, namespace, access_level, name, utc_now()))


def get_pattern(tx: Transaction, pattern_id: str) -> Pattern | None:
    if not is_ident(pattern_id):
        return None
    row = tx.pattern_row(pattern_id)
    return _pattern(row) if row is not None else None


def count_pattern_outcome(tx: Transaction, pattern_id: str, *, success: bool) -> None:
    tx.pattern_outcome_count(pattern_id, success=success)


# --- evidence -------------------------------------------------------------------------------


def insert_verification(
    tx: Transaction,
    *,
    verification_id: str,
    agent_id: str,
    claim_type: str,
    verdict: str,
    decided_by: str,
    verifier_id: str,
    verified_at: str,
    evidence_id: str,
    evidence: bytes,
) -> None:
    tx.verification_insert(
        (
            verification_id,
            agent_id,
            claim_type,
            verdict,
            decided_by,
            verifier_id,
            verified_at,
            evidence_id,
            evidence,
        )
    )


def history(
    tx: Transaction, agent_id: str, claim_type: str | None, limit: int
) -> list[tuple[str, bytes]]:
    """``(evidence_id, evidence bytes)`` newest first (by commit order)."""
    return [_evidence(agent_id, r) for r in tx.verification_evidence(agent_id, claim_type, limit)]


def verdict_counts(tx: Transaction, agent_id: str) -> list[tuple[str, str, int]]:
    """``(claim_type, verdict, count)`` over all of the agent's verifications."""
    return [(r[0], r[1], int(r[2])) for r in tx.verdict_counts(agent_id)]


def evidence_rows(tx: Transaction, agent_id: str) -> list[tuple[str, str, bytes, str]]:
    """Every ``(verification_id, evidence_id, evidence bytes, verdict)`` of the agent, oldest
    first."""
    out = []
    for r in tx.verification_rows(agent_id):
        evidence_id, body = _evidence(agent_id, (r[1], r[2]))
        out.append((str(r[0]), evidence_id, body, str(r[3])))
    return out


def recent(tx: Transaction, agent_id: str, limit: int) -> list[tuple[Any, ...]]:
    return tx.verifications_recent(agent_id, limit)


def get_evidence(tx: Transaction, verification_id: str) -> tuple[str, bytes] | None:
    row = tx.verification_evidence_of(verification_id)
    return _evidence(None, row) if row is not None else None


# --- the trust log --------------------------------------------------------------------------


def append_trust(
    tx: Transaction, agent_id: str, entry_type: str, payload: dict[str, Any]
) -> TrustEntry:
    """Append one entry, chained from the agent's head (the caller holds the agent's row
    lock, so the head cannot move underneath). ``H_i`` uses the job-event formula with the
    entry id and type in place of the event's."""
    head = tx.trust_head(agent_id)
    version, previous = (int(head[0]), bytes.fromhex(head[1])) if head else (0, GENESIS)
    entry_id = new_event_id()
    body = canonical(payload)
    chain_hash = chain_next(previous, entry_id, entry_type, body).hex()
    tx.trust_entry_insert((agent_id, version + 1, entry_id, entry_type, body, chain_hash))
    return TrustEntry(agent_id, version + 1, entry_id, entry_type, body, chain_hash)


def trust_log(tx: Transaction, agent_id: str) -> list[TrustEntry]:
    return [_entry(r) for r in tx.trust_entries(agent_id)]
