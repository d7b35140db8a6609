"""API keys of the HTTP API (table ``api_keys``): rows, the writes (in a transaction) and the
reads (on the store's read connections, so authenticating a request takes no write lock); and
the counts ``/metrics`` reads.

Only a SHA-256 of each key's secret is stored; see :mod:`affidavit.faces.auth`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from affidavit.store.base import ApiKeyRow

APIKEY_COLUMNS = "key_id, agent_id, role, namespace, key_hash, created_at, revoked_at"


def _row(r: Sequence[Any]) -> ApiKeyRow:
    return ApiKeyRow(*r)


class ApiKeyWrites:
    """Mixed into the SQL transaction."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def apikey_insert(self, row: ApiKeyRow) -> None:
        self.execute(
            f"INSERT INTO api_keys ({APIKEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                row.key_id,
                row.agent_id,
                row.role,
                row.namespace,
                row.key_hash,
                row.created_at,
                row.revoked_at,
            ),
        )

    def apikey_revoke(self, key_id: str, at: str) -> ApiKeyRow | None:
        """Revoke ``key_id`` (once: a revoked key keeps its first revocation time); the row
        after the change, ``None`` if there is no such key."""
        self.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
            (at, key_id),
        )
        rows = self.query(f"SELECT {APIKEY_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,))
        return _row(rows[0]) if rows else None


class ApiKeyReads:
    """Mixed into the SQL store."""

    @abstractmethod
    def _read_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def get_api_key(self, key_id: str) -> ApiKeyRow | None:
        rows = self._read_rows(f"SELECT {APIKEY_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,))
        return _row(rows[0]) if rows else None

    def list_api_keys(self) -> list[ApiKeyRow]:
        rows = self._read_rows(f"SELECT {APIKEY_COLUMNS} FROM api_keys ORDER BY created_at, key_id")
        return [_row(r) for r in rows]

    def count_jobs_by_status(self) -> dict[str, int]:
        """Job status → how many jobs have it (for metrics)."""
        rows = self._read_rows("SELECT status, count(*) FROM jobs GROUP BY status")
        return {str(s): int(n) for s, n in rows}

    def count_claim_verdicts(self) -> dict[tuple[str, str], int]:
        """(claim type, verdict) → how many claim verifications had it (for metrics)."""
        rows = self._read_rows(
            "SELECT claim_type, verdict, count(*) FROM claim_verifications "
            "GROUP BY claim_type, verdict"
        )
        return {(str(t), str(v)): int(n) for t, v, n in rows}

    def count_invocations_by_status(self) -> dict[str, int]:
        """Ledger row status (started, committed, failed) → count (for metrics)."""
        rows = self._read_rows("SELECT status, count(*) FROM tool_invocations GROUP BY status")
        return {str(s): int(n) for s, n in rows}
