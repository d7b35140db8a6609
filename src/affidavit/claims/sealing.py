"""Trust logs are sealed like jobs: every entry appended to an agent's trust log is sealed in
the same transaction, with the signing key of job seals, and the seal's leaf is queued for the
transparency log.

A trust-log seal is a seal (docs/formats.md, "Seals") whose record id is
``trust:<agent_id>:<n>``: it signs that the agent's trust log had ``n`` entries whose last
chain hash is ``event_chain_root_hash``. Each seal covers the log's prefix of that length; the
next entry's seal extends it. Its transparency-log leaf is the seal leaf of that record id, so
the log holds one leaf per seal (a record id is never reused). Seals carry no ``events_root``
(the v1 form): sealing an entry reads only the log's head, never the whole log.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from affidavit.claims import records
from affidavit.claims.model import TrustEntry
from affidavit.core.seal import Seal, log_leaf
from affidavit.core.signing import SigningKey, default_key_path
from affidavit.store import Transaction, trust_record_id


class TrustSealer:
    """Signs trust-log seals with one key, loaded (or created) on first use; shared by the
    threads of one service."""

    def __init__(self, path: Path | None = None, *, key: SigningKey | None = None) -> None:
        if path is None and key is None:
            raise ValueError("a TrustSealer needs a key file path or a key")
        self._path = path
        self._key = key
        self._lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str) -> TrustSealer:
        """The sealer with the store's signing key (:func:`default_key_path`)."""
        return cls(default_key_path(url))

    def key(self) -> SigningKey:
        """Raises :class:`~affidavit.core.signing.SigningKeyError`: the key file cannot be
        read or created."""
        with self._lock:
            if self._key is None:
                assert self._path is not None
                self._key = SigningKey.load_or_create(self._path)
            return self._key

    def seal_txn(self, tx: Transaction, entry: TrustEntry) -> Seal:
        """Seal the agent's trust log as it ends at ``entry`` (just appended in ``tx``), store
        the seal and queue its leaf, in ``tx``.

        Raises:
            SealKeyRefused: the database does not accept this sealer's key for new seals
                (``tx`` must then be rolled back).
        """
        key = self.key()
        seal = key.seal(
            trust_record_id(entry.agent_id, entry.version), entry.version, entry.chain_hash
        )
        # (the database must accept the key, as for a job's seal: it registers the first one)
        tx.seal_key_admit(key.public, at=seal.sealed_at).require_active(key)
        tx.trust_seal_insert(entry.agent_id, seal, leaf=log_leaf(seal), queued_at=time.time())
        return seal


def append_sealed(
    tx: Transaction,
    sealer: TrustSealer,
    agent_id: str,
    entry_type: str,
    payload: dict[str, Any],
) -> TrustEntry:
    """Append one entry to the agent's trust log and seal the log as it now ends (the caller
    holds the agent's row lock, or has just inserted the agent)."""
    entry = records.append_trust(tx, agent_id, entry_type, payload)
    sealer.seal_txn(tx, entry)
    return entry
