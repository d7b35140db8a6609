"""The seal a job gets when it reaches a terminal state, signed by a :class:`Sealer`.

The key and where it lives: :mod:`affidavit.core.signing` (its names are re-exported here).

Crash safety: the seal is written in the same transaction as the job's terminal event (see
:meth:`Sealer.seal_txn`), so a terminal job without a seal is not a state a crash can leave
behind. Jobs that finished before seals existed can be sealed afterwards with
:func:`affidavit.verify.repair.seal_unsealed`, which verifies each log first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from affidavit.core.errors import AffidavitError, JobNotFound
from affidavit.core.events import utc_now
from affidavit.core.seal import Seal, events_root, log_leaf
from affidavit.core.signing import (
    KEY_ENV,
    KEY_FILE_NAME,
    SigningKey,
    SigningKeyError,
    default_key_path,
    install_key_file,
    stage_key_file,
)
from affidavit.store import TERMINAL_STATUSES, Store, Transaction

__all__ = [
    "KEY_ENV",
    "KEY_FILE_NAME",
    "Sealer",
    "SigningKey",
    "SigningKeyError",
    "default_key_path",
]


class Sealer:
    """Signs seals with one key file; the key is loaded (or created) on first use. Shared by
    the threads of one worker."""

    def __init__(self, path: Path | str | None = None, *, key: SigningKey | None = None) -> None:
        if path is None and key is None:
            raise ValueError("a Sealer needs a key file path or a key")
        self.path = Path(path) if path is not None else None
        self._key = key
        self._lock = threading.Lock()

    @classmethod
    def for_store(cls, store: Store) -> Sealer:
        return cls(default_key_path(store.url))

    def key(self) -> SigningKey:
        """The signing key, loaded or created now if this is the first use.

        Raises:
            SigningKeyError: the key file cannot be read or created.
        """
        with self._lock:
            if self._key is None:
                assert self.path is not None
                self._key = SigningKey.load_or_create(self.path)
            return self._key

    def seal_txn(
        self,
        tx: Transaction,
        job_id: str,
        *,
        head: tuple[int, str] | None = None,
        hashes: Sequence[bytes] | None = None,
    ) -> Seal:
        """Seal ``job_id`` inside ``tx``, the transaction that appended its terminal event: the
        seal covers the log as this transaction leaves it. Registers the public key too, and
        queues the seal's transparency-log leaf with it (a crash before the sequencer
        integrates it loses nothing).

        ``head``: the log's last version and chain hash (hex) as this transaction leaves it,
        when the caller knows them because it appended the last event itself (a run); read
        from the job otherwise. ``hashes``: every event's raw chain hash, in order, when the
        caller knows them too (a run that read the log and appended the rest); read
        otherwise.

        Raises:
            JobNotFound: no such job.
        """
        key = self.key()
        if head is None:
            job = tx.get_job(job_id)
            if job is None:
                raise JobNotFound(job_id)
            head = (job.version, job.head_hash or "")
        # a v2 seal: the Merkle root over the events' chain hashes, as this transaction sees them
        if hashes is None:
            hashes = tx.seal_chain_hashes(job_id)
        if len(hashes) != head[0] or (hashes and hashes[-1].hex() != head[1]):
            raise AffidavitError(
                f"job {job_id}'s log changed under its seal: {len(hashes)} events read, "
                f"{head[0]} expected",
                hint="",
            )
        seal = key.seal(job_id, head[0], head[1], events_root(hashes))
        tx.key_register(key.public, created_at=seal.sealed_at)
        tx.seal_insert(seal, leaf=log_leaf(seal), queued_at=time.time())
        return seal

    def seal_job(self, store: Store, job_id: str) -> Seal | None:
        """Seal a terminal job that has no seal (one sealed before keeps its seal); ``None``
        if the job is not terminal.

        Raises:
            JobNotFound: no such job.
        """
        self.key()
        with store.transaction(durable=True) as tx:
            job = tx.get_job(job_id, for_update=True)
            if job is None:
                raise JobNotFound(job_id)
            if job.status not in TERMINAL_STATUSES:
                return None
            existing = tx.seal_get(job_id)
            return existing if existing is not None else self.seal_txn(tx, job_id)

    def rotate(self, store: Store) -> tuple[SigningKey | None, SigningKey]:
        """Replace the key file with a new key; return (old, new). The old public key stays in
        the database (marked retired) so its seals keep verifying; the old key file is kept
        beside the new one as ``<name>.retired-<key_id>``. Workers already running keep the
        key they loaded until they restart; its seals verify as well.

        Raises:
            SigningKeyError: the key files cannot be read or written.
        """
        if self.path is None:
            raise AffidavitError("this sealer has no key file to rotate", hint="")
        with self._lock:
            old = SigningKey.load(self.path) if self.path.exists() else None
            new = SigningKey.generate()
            staged = stage_key_file(self.path, new)
            try:
                # The new public key is recorded before anything can sign with it.
                with store.transaction(durable=True) as tx:
                    now = utc_now()
                    if old is not None:
                        tx.key_register(old.public, created_at=now)
                        tx.key_retire(old.key_id, retired_at=now)
                    tx.key_register(new.public, created_at=now)
                install_key_file(self.path, staged, old)
            finally:
                if staged.exists():
                    staged.unlink()
            self._key = SigningKey(new.private, self.path)
            return old, self._key

    def register(self, store: Store) -> SigningKey:
        """Load (or create) the key and record its public key in ``store``."""
        key = self.key()
        with store.transaction(durable=True) as tx:
            tx.key_register(key.public, created_at=utc_now())
        return key
