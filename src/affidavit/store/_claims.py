"""Transaction operations for the claims tables: agents, learning patterns and verifications
(migration 4), agents' trust logs (migration 4) and the claims agents record (migration 11).

Mixed into :class:`~affidavit.store._sql.SqlTransaction`; declared for callers by
:class:`ClaimsTransaction`. The store keeps the SQL and hands back rows (tuples in the column
order of the ``*_COLUMNS`` constants); :mod:`affidavit.claims.records` makes them the claims
layer's values. ``agents`` is the only mutable table (score and counters, updated under the
row lock :meth:`ClaimOps.agent_row` takes with ``for_update``); ``claim_verifications``,
``trust_log`` and ``claims`` are append-only (the database refuses UPDATE and DELETE). SQL uses
``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

AGENT_COLUMNS = (
    "agent_id, namespace, role, trust_score, verifications, accurate_verifications, "
    "error_verifications, created_at, updated_at"
)
PATTERN_COLUMNS = (
    "pattern_id, owner_agent_id, namespace, access_level, name, success_count, failure_count, "
    "created_at"
)
TRUST_COLUMNS = "agent_id, version, entry_id, type, payload, chain_hash"
CLAIM_COLUMNS = "claim_id, agent_id, namespace, claim_type, content, command, created_at"
VERIFICATION_COLUMNS = (
    "verification_id, agent_id, claim_type, verdict, decided_by, verifier_id, verified_at, "
    "evidence_id, evidence"
)

Row = tuple[Any, ...]


class ClaimOps:
    """The claims tables' reads and writes; relies on the transaction primitives and on
    ``FOR_UPDATE``, the backend's row-lock clause (empty on SQLite, whose write transaction
    already excludes other writers)."""

    FOR_UPDATE: str

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    # --- agents -----------------------------------------------------------------------------

    def agent_insert(
        self, agent_id: str, namespace: str, role: str, score: float, now: str
    ) -> bool:
        """Insert an agent with no verifications; ``False`` if the id is taken (nothing
        written)."""
        rows = self.query(
            f"INSERT INTO agents ({AGENT_COLUMNS}) VALUES (?, ?, ?, ?, 0, 0, 0, ?, ?) "
            "ON CONFLICT DO NOTHING RETURNING agent_id",
            (agent_id, namespace, role, score, now, now),
        )
        return bool(rows)

    def agent_row(self, agent_id: str, *, for_update: bool = False) -> Row | None:
        """The agent's row (``AGENT_COLUMNS``), locked until the transaction ends when
        ``for_update``."""
        lock = self.FOR_UPDATE if for_update else ""
        rows = self.query(
            f"SELECT {AGENT_COLUMNS} FROM agents WHERE agent_id = ?{lock}", (agent_id,)
        )
        return tuple(rows[0]) if rows else None

    def agent_rows(self, namespace: str | None) -> list[Row]:
        """Every agent's row, of one namespace or of all (by namespace, then id)."""
        if namespace is None:
            rows = self.query(f"SELECT {AGENT_COLUMNS} FROM agents ORDER BY namespace, agent_id")
        else:
            rows = self.query(
                f"SELECT {AGENT_COLUMNS} FROM agents WHERE namespace = ? ORDER BY agent_id",
                (namespace,),
            )
        return [tuple(r) for r in rows]

    def agent_trust_update(
        self, agent_id: str, score: float, *, judged: bool, accurate: bool, now: str
    ) -> None:
        """Write the agent's new score and bump its counters (the caller holds its row lock)."""
        self.execute(
            "UPDATE agents SET trust_score = ?, verifications = verifications + ?, "
            "accurate_verifications = accurate_verifications + ?, "
            "error_verifications = error_verifications + ?, updated_at = ? WHERE agent_id = ?",
            (score, int(judged), int(accurate), int(not judged), now, agent_id),
        )

    # --- patterns ---------------------------------------------------------------------------

    def pattern_insert(self, row: Sequence[Any]) -> bool:
        """Insert a pattern ``(pattern_id, owner_agent_id, namespace, access_level, name,
        created_at)`` with no outcomes; ``False`` if the id is taken (nothing written)."""
        rows = self.query(
            f"INSERT INTO learning_patterns ({PATTERN_COLUMNS}) VALUES (?, ?, ?, ?, ?, 0, 0, ?) "
            "ON CONFLICT DO NOTHING RETURNING pattern_id",
            tuple(row),
        )
        return bool(rows)

    def pattern_row(self, pattern_id: str) -> Row | None:
        """The pattern's row (``PATTERN_COLUMNS``)."""
        rows = self.query(
            f"SELECT {PATTERN_COLUMNS} FROM learning_patterns WHERE pattern_id = ?", (pattern_id,)
        )
        return tuple(rows[0]) if rows else None

    def pattern_outcome_count(self, pattern_id: str, *, success: bool) -> None:
        """Count one more success (or failure) of the pattern."""
        column = "success_count" if success else "failure_count"
        self.execute(
            f"UPDATE learning_patterns SET {column} = {column} + 1 WHERE pattern_id = ?",
            (pattern_id,),
        )

    # --- verifications ----------------------------------------------------------------------

    def verification_insert(self, row: Sequence[Any]) -> None:
        """Insert one verification (``VERIFICATION_COLUMNS``)."""
        self.execute(
            f"INSERT INTO claim_verifications ({VERIFICATION_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            tuple(row),
        )

    def verification_evidence(self, agent_id: str, claim_type: str | None, limit: int) -> list[Row]:
        """``(evidence_id, evidence)`` of the agent's verifications (of one claim type, or of
        all), newest first (by commit order), at most ``limit``."""
        if claim_type is None:
            rows = self.query(
                "SELECT evidence_id, evidence FROM claim_verifications WHERE agent_id = ? "
                "ORDER BY seq DESC LIMIT ?",
                (agent_id, limit),
            )
        else:
            rows = self.query(
                "SELECT evidence_id, evidence FROM claim_verifications "
                "WHERE agent_id = ? AND claim_type = ? ORDER BY seq DESC LIMIT ?",
                (agent_id, claim_type, limit),
            )
        return [tuple(r) for r in rows]

    def verdict_counts(self, agent_id: str) -> list[Row]:
        """``(claim_type, verdict, count)`` over all of the agent's verifications."""
        rows = self.query(
            "SELECT claim_type, verdict, count(*) FROM claim_verifications WHERE agent_id = ? "
            "GROUP BY claim_type, verdict ORDER BY claim_type, verdict",
            (agent_id,),
        )
        return [tuple(r) for r in rows]

    def verification_rows(self, agent_id: str) -> list[Row]:
        """Every ``(verification_id, evidence_id, evidence, verdict)`` of the agent, oldest
        first."""
        rows = self.query(
            "SELECT verification_id, evidence_id, evidence, verdict FROM claim_verifications "
            "WHERE agent_id = ? ORDER BY seq",
            (agent_id,),
        )
        return [tuple(r) for r in rows]

    def verifications_recent(self, agent_id: str, limit: int) -> list[Row]:
        """``(verification_id, claim_type, verdict, decided_by, verified_at)`` of the agent's
        latest ``limit`` verifications, newest first."""
        rows = self.query(
            "SELECT verification_id, claim_type, verdict, decided_by, verified_at "
            "FROM claim_verifications WHERE agent_id = ? ORDER BY seq DESC LIMIT ?",
            (agent_id, limit),
        )
        return [tuple(r) for r in rows]

    def verification_evidence_of(self, verification_id: str) -> Row | None:
        """``(evidence_id, evidence)`` of one verification."""
        rows = self.query(
            "SELECT evidence_id, evidence FROM claim_verifications WHERE verification_id = ?",
            (verification_id,),
        )
        return tuple(rows[0]) if rows else None

    # --- trust logs -------------------------------------------------------------------------

    def trust_head(self, agent_id: str) -> Row | None:
        """``(version, chain_hash)`` of the last entry of the agent's trust log."""
        rows = self.query(
            "SELECT version, chain_hash FROM trust_log WHERE agent_id = ? "
            "ORDER BY version DESC LIMIT 1",
            (agent_id,),
        )
        return tuple(rows[0]) if rows else None

    def trust_entry_insert(self, row: Sequence[Any]) -> None:
        """Insert one trust-log entry (``TRUST_COLUMNS``; the caller chained it from the head,
        holding the agent's row lock)."""
        self.execute(
            f"INSERT INTO trust_log ({TRUST_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", tuple(row)
        )

    def trust_entries(self, agent_id: str) -> list[Row]:
        """The agent's trust log (``TRUST_COLUMNS``) in version order."""
        rows = self.query(
            f"SELECT {TRUST_COLUMNS} FROM trust_log WHERE agent_id = ? ORDER BY version",
            (agent_id,),
        )
        return [tuple(r) for r in rows]

    # --- claims agents record ---------------------------------------------------------------

    def claim_insert(self, row: Sequence[Any]) -> None:
        """Insert one recorded claim (``CLAIM_COLUMNS``, the content canonical JSON bytes)."""
        self.execute(
            f"INSERT INTO claims ({CLAIM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", tuple(row)
        )

    def claim_row(self, claim_id: str) -> Row | None:
        """The recorded claim's row (``CLAIM_COLUMNS``)."""
        rows = self.query(f"SELECT {CLAIM_COLUMNS} FROM claims WHERE claim_id = ?", (claim_id,))
        return tuple(rows[0]) if rows else None


class ClaimsTransaction(Protocol):
    """The claims tables' operations of a :class:`~affidavit.store.base.Transaction` (see
    :class:`ClaimOps`)."""

    def agent_insert(
        self, agent_id: str, namespace: str, role: str, score: float, now: str
    ) -> bool: ...

    def agent_row(self, agent_id: str, *, for_update: bool = False) -> Row | None: ...

    def agent_rows(self, namespace: str | None) -> list[Row]: ...

    def agent_trust_update(
        self, agent_id: str, score: float, *, judged: bool, accurate: bool, now: str
    ) -> None: ...

    def pattern_insert(self, row: Sequence[Any]) -> bool: ...

    def pattern_row(self, pattern_id: str) -> Row | None: ...

    def pattern_outcome_count(self, pattern_id: str, *, success: bool) -> None: ...

    def verification_insert(self, row: Sequence[Any]) -> None: ...

    def verification_evidence(
        self, agent_id: str, claim_type: str | None, limit: int
    ) -> list[Row]: ...

    def verdict_counts(self, agent_id: str) -> list[Row]: ...

    def verification_rows(self, agent_id: str) -> list[Row]: ...

    def verifications_recent(self, agent_id: str, limit: int) -> list[Row]: ...

    def verification_evidence_of(self, verification_id: str) -> Row | None: ...

    def trust_head(self, agent_id: str) -> Row | None: ...

    def trust_entry_insert(self, row: Sequence[Any]) -> None: ...

    def trust_entries(self, agent_id: str) -> list[Row]: ...

    def claim_insert(self, row: Sequence[Any]) -> None: ...

    def claim_row(self, claim_id: str) -> Row | None: ...
