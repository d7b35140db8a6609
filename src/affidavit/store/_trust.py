"""Transaction operations for trust (tables of migration 15): the verification that moved trust
for each recorded claim, and the seals of agents' trust logs with their transparency-log
leaves.

Mixed into :class:`~affidavit.store._sql.SqlTransaction`, so that a trust-log entry, its seal
and its leaf commit together. SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from affidavit.core.seal import Seal

TRUST_RECORD_PREFIX = "trust:"
TRUST_MIGRATION = 15
_SEAL_COLUMNS = "entry_count, chain_head, sealed_at, key_id, algorithm, signature"


def trust_record_id(agent_id: str, entry_count: int) -> str:
    """The id under which the seal of an agent's trust log at ``entry_count`` entries is
    signed and logged: ``trust:<agent_id>:<entry_count>`` (no job id has this form: job ids
    are UUIDs)."""
    return f"{TRUST_RECORD_PREFIX}{agent_id}:{entry_count}"


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """The verification that moved trust for a recorded claim."""

    claim_id: str
    verification_id: str
    verdict: str


class TrustOps:
    """Claim outcomes and trust-log seals; relies on the transaction primitives. On a copy
    made before migration 15, read as it is by a read-only store (``trust_tables`` false),
    there are none."""

    trust_tables = True

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def claim_outcome(self, claim_id: str) -> ClaimOutcome | None:
        """The verification that moved trust for ``claim_id``, or ``None`` if none has yet."""
        if not self.trust_tables:
            return None
        rows = self.query(
            "SELECT claim_id, verification_id, verdict FROM claim_outcomes WHERE claim_id = ?",
            (claim_id,),
        )
        return ClaimOutcome(str(rows[0][0]), str(rows[0][1]), str(rows[0][2])) if rows else None

    def claim_outcome_insert(
        self, claim_id: str, agent_id: str, verification_id: str, verdict: str
    ) -> None:
        """Record the verification that moved trust for ``claim_id`` (the caller holds the
        claimant's row lock and found none: :meth:`claim_outcome`)."""
        self.execute(
            "INSERT INTO claim_outcomes (claim_id, agent_id, verification_id, verdict) "
            "VALUES (?, ?, ?, ?)",
            (claim_id, agent_id, verification_id, verdict),
        )

    def trust_seal_insert(
        self, agent_id: str, seal: Seal, *, leaf: bytes, queued_at: float
    ) -> None:
        """Store the seal of ``agent_id``'s trust log at ``seal.event_count`` entries and queue
        its transparency-log leaf under the seal's record id, in this transaction."""
        self.execute(
            f"INSERT INTO trust_seals (agent_id, {_SEAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                agent_id,
                seal.event_count,
                seal.event_chain_root_hash,
                seal.sealed_at,
                seal.key_id,
                seal.algorithm,
                seal.signature,
            ),
        )
        self.execute(
            "INSERT INTO tlog_queue (job_id, leaf, queued_at) VALUES (?, ?, ?)",
            (seal.job_id, leaf, queued_at),
        )

    def trust_seal_latest(self, agent_id: str) -> Seal | None:
        """The seal of the longest prefix of ``agent_id``'s trust log that has one.

        Raises:
            ValueError: the row holds another type than the store writes (edited by hand).
        """
        if not self.trust_tables:
            return None
        rows = self.query(
            f"SELECT {_SEAL_COLUMNS} FROM trust_seals WHERE agent_id = ? "
            "ORDER BY entry_count DESC LIMIT 1",
            (agent_id,),
        )
        if not rows:
            return None
        from affidavit.core.seal import Seal

        count, head, sealed_at, key_id, algorithm, signature = rows[0]
        return Seal.from_dict(
            {
                "job_id": trust_record_id(agent_id, count) if type(count) is int else "",
                "event_count": count,
                "event_chain_root_hash": head,
                "sealed_at": sealed_at,
                "key_id": key_id,
                "algorithm": algorithm,
                "signature": signature,
            }
        )

    def tlog_record_leaf(self, record_id: str) -> tuple[bytes | None, bool]:
        """``(leaf, queued)``: the leaf the transparency log holds for ``record_id`` (``None``
        if none is integrated) and whether one waits in its queue."""
        leaves = self.query(
            "SELECT leaf FROM tlog_leaves WHERE job_id = ? ORDER BY idx + 0 LIMIT 1", (record_id,)
        )
        queued = self.query("SELECT 1 FROM tlog_queue WHERE job_id = ? LIMIT 1", (record_id,))
        leaf = bytes(leaves[0][0]) if leaves and leaves[0][0] is not None else None
        return leaf, bool(queued)


class TrustTransaction(Protocol):
    """The trust operations of a :class:`~affidavit.store.base.Transaction` (see
    :class:`TrustOps`)."""

    def claim_outcome(self, claim_id: str) -> ClaimOutcome | None: ...

    def claim_outcome_insert(
        self, claim_id: str, agent_id: str, verification_id: str, verdict: str
    ) -> None: ...

    def trust_seal_insert(
        self, agent_id: str, seal: Seal, *, leaf: bytes, queued_at: float
    ) -> None: ...

    def trust_seal_latest(self, agent_id: str) -> Seal | None: ...

    def tlog_record_leaf(self, record_id: str) -> tuple[bytes | None, bool]: ...
