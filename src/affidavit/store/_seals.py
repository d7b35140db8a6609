"""Transaction operations for seals and the public keys that check them.

Mixed into :class:`~affidavit.store._sql.SqlTransaction`, so that a job's terminal event and its
seal commit together. SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from affidavit.core.seal import ALGORITHM, PublicKey, Seal, b64, unb64

if TYPE_CHECKING:
    from affidavit.store._sql import LogSql

SEAL_COLUMNS = (
    "job_id, event_count, event_chain_root_hash, sealed_at, key_id, algorithm, signature, "
    "version, events_root"
)
SEAL_SELECT = f"SELECT {SEAL_COLUMNS} FROM seals WHERE job_id = ?"
# a copy made before migration 12 (read as it is by a read-only store): every seal is v1
LEGACY_SEAL_SELECT = (
    "SELECT job_id, event_count, event_chain_root_hash, sealed_at, key_id, algorithm, "
    "signature, 1, NULL FROM seals WHERE job_id = ?"
)
SEALS_V2_MIGRATION = 12
KEYS_SELECT = (
    "SELECT key_id, public_key, created_at, retired_at FROM signing_keys "
    "WHERE algorithm = 'ed25519' ORDER BY created_at, key_id"
)


def seal_from_row(row: Sequence[Any]) -> Seal:
    """The seal of a ``SEAL_SELECT`` row.

    Raises:
        ValueError: a column holds another type than its field's (a row edited outside the
            store; SQLite keeps whatever a column is given): the message names the field.
    """
    fields = dict(zip(SEAL_COLUMNS.split(", "), row, strict=True))
    if fields["version"] == 1:  # (a v1 seal's JSON has neither field)
        del fields["version"]
        if fields["events_root"] is None:
            del fields["events_root"]
    return Seal.from_dict(fields)


def key_from_row(row: Sequence[Any]) -> PublicKey:
    try:
        raw = unb64(row[1]) if isinstance(row[1], str) else b""
    except ValueError:
        raw = b""
    # (a damaged row gives a key no seal verifies with, which verification reports)
    return PublicKey(key_id=row[0], public_key=raw, created_at=row[2], retired_at=row[3])


# A job's end stores its seal, its key and its log leaf (each statement a constant: see
# affidavit.store._pg_statements._PREPARED_STATEMENTS)
SEAL_INSERT = (
    f"INSERT INTO seals ({SEAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
# the leaf is queued only if the seal stored is the one given (not one stored before it)
LEAF_QUEUE_INSERT = (
    "INSERT INTO tlog_queue (job_id, leaf, queued_at) SELECT ?, ?, ? WHERE EXISTS "
    "(SELECT 1 FROM seals WHERE job_id = ? AND signature = ?)"
)
KEY_INSERT = (
    "INSERT INTO signing_keys (key_id, algorithm, public_key, created_at, retired_at) "
    "VALUES (?, ?, ?, ?, NULL) ON CONFLICT DO NOTHING"
)


class SealOps:
    """Seal and key statements; relies on the transaction primitives."""

    log_sql: LogSql

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def seal_insert(self, seal: Seal, *, leaf: bytes | None = None, queued_at: float = 0.0) -> None:
        """Store a job's seal (one it already has is kept) and queue ``leaf`` if this seal is
        the one stored: the queue's insert asks the server, so nothing is read back here."""
        self.execute(
            SEAL_INSERT,
            (
                seal.job_id,
                seal.event_count,
                seal.event_chain_root_hash,
                seal.sealed_at,
                seal.key_id,
                seal.algorithm,
                seal.signature,
                seal.version,
                seal.events_root,
            ),
        )
        if leaf is not None:
            self.execute(
                LEAF_QUEUE_INSERT,
                (seal.job_id, leaf, queued_at, seal.job_id, seal.signature),
            )

    def seal_chain_hashes(self, job_id: str) -> list[bytes]:
        """The raw stored chain hashes of the job's events in version order, as this transaction
        sees them: the leaves of a v2 seal's ``events_root``."""
        rows = self.query(self.log_sql.hashes, (job_id,))
        return [bytes.fromhex(r[0]) for r in rows]

    def seal_get(self, job_id: str) -> Seal | None:
        rows = self.query(SEAL_SELECT, (job_id,))
        return seal_from_row(rows[0]) if rows else None

    def key_register(self, key: PublicKey, *, created_at: str) -> None:
        """Record a public key (a key id already known is left as it is)."""
        self.execute(
            KEY_INSERT,
            (key.key_id, ALGORITHM, b64(key.public_key), created_at),
        )

    def key_retire(self, key_id: str, *, retired_at: str) -> None:
        """Mark a key retired: it signs nothing new, and still verifies what it signed."""
        self.execute(
            "UPDATE signing_keys SET retired_at = ? WHERE key_id = ? AND retired_at IS NULL",
            (retired_at, key_id),
        )

    def keys_list(self) -> list[PublicKey]:
        return [key_from_row(r) for r in self.query(KEYS_SELECT)]
