"""The seal a job gets when it reaches a terminal state, signed by a :class:`Sealer`.

The key and where it lives: :mod:`affidavit.core.signing` (its names are re-exported here).

Which keys may seal: the database records the public keys it accepts. A sealer's key is
admitted before it seals (:meth:`Sealer.admit`, run by a worker, ``affidavit run`` and
``serve`` when they start): the first key that seals in an empty database is registered, any
other one is refused (:class:`~affidavit.core.signing.SealKeyRefused`) until an operator
registers it (``affidavit keys trust``, ``keys rotate``). A retired key verifies its old seals
but is refused for new ones; a process that admitted it before it was retired keeps sealing
with it until it restarts.

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
from affidavit.core.seal import PublicKey, Seal, events_root, log_leaf
from affidavit.core.signing import (
    KEY_ENV,
    KEY_FILE_NAME,
    SealKeyRefused,
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
    "SealKeyRefused",
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
        self._admitted = False  # the key was admitted to the store it seals in (admit)

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

    def admit(self, store: Store) -> SigningKey:
        """Load (or create) the key and check that ``store`` accepts it for new seals,
        registering it if the store has no key yet; once admitted, a sealer is not checked
        again (a key retired later keeps sealing here until the process restarts).

        Raises:
            SigningKeyError: the key file cannot be read or created.
            SealKeyRefused: the store accepts other keys only, or has retired this one.
        """
        key = self.key()
        if self._admitted:
            return key
        with store.transaction(durable=True) as tx:
            admission = tx.seal_key_admit(key.public, at=utc_now())
        admission.require_active(key)
        self._admitted = True
        return key

    def seal_txn(
        self,
        tx: Transaction,
        job_id: str,
        *,
        head: tuple[int, str] | None = None,
        hashes: Sequence[bytes] | None = None,
    ) -> Seal:
        """Seal ``job_id`` inside ``tx``, the transaction that appended its terminal event: the
        seal covers the log as this transaction leaves it, and queues the seal's
        transparency-log leaf with it (a crash before the sequencer integrates it loses
        nothing). A sealer not admitted yet (:meth:`admit`) is admitted inside ``tx``: the
        store registers its key if it has none, and a key it does not accept seals nothing.

        ``head``: the log's last version and chain hash (hex) as this transaction leaves it,
        when the caller knows them because it appended the last event itself (a run); read
        from the job otherwise. ``hashes``: every event's raw chain hash, in order, when the
        caller knows them too (a run that read the log and appended the rest); read
        otherwise.

        Raises:
            JobNotFound: no such job.
            SealKeyRefused: the store does not accept this sealer's key (``tx`` must then be
                rolled back: the terminal event it appended has no seal).
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
        if not self._admitted:  # (a worker admitted its key when it started)
            tx.seal_key_admit(key.public, at=seal.sealed_at).require_active(key)
        tx.seal_insert(seal, leaf=log_leaf(seal), queued_at=time.time())
        return seal

    def seal_job(self, store: Store, job_id: str) -> Seal | None:
        """Seal a terminal job that has no seal (one sealed before keeps its seal); ``None``
        if the job is not terminal.

        Raises:
            JobNotFound: no such job.
        """
        self.admit(store)
        with store.transaction(durable=True) as tx:
            job = tx.get_job(job_id, for_update=True)
            if job is None:
                raise JobNotFound(job_id)
            if job.status not in TERMINAL_STATUSES:
                return None
            existing = tx.seal_get(job_id)
            return existing if existing is not None else self.seal_txn(tx, job_id)

    def rotate(self, store: Store) -> tuple[SigningKey | None, SigningKey]:
        """Replace the key file with a new key, registered as accepted; return (old, new).
        The old key, if the store accepted it, stays recorded but retired: its seals keep
        verifying and it seals nothing new in a process started from now on (one already
        running keeps it until it restarts). An old key the store never accepted stays
        unregistered. The old key file is kept beside the new one as
        ``<name>.retired-<key_id>``.

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
                        tx.key_retire(old.key_id, retired_at=now)  # (if it is recorded)
                    tx.key_register(new.public, created_at=now)
                install_key_file(self.path, staged, old)
            finally:
                if staged.exists():
                    staged.unlink()
            self._key = SigningKey(new.private, self.path)
            self._admitted = True
            return old, self._key


def trust_key(store: Store, key: PublicKey) -> str:
    """Register ``key`` as accepted for sealing in ``store`` (an operator's act); return what
    it was before: ``unregistered`` (now ``active``), ``active`` or ``retired`` (left so).

    Raises:
        SealKeyRefused: the key id is recorded with another public key.
    """
    with store.transaction(durable=True) as tx:
        found = next((k for k in tx.keys_list() if k.key_id == key.key_id), None)
        if found is None:
            tx.key_register(key, created_at=utc_now())
            return "unregistered"
    if found.public_key != key.public_key:
        raise SealKeyRefused(
            f"key id {key.key_id} is registered in this database with another public key",
            hint="Check the key given; `affidavit keys list` shows the registered ones.",
        )
    return "active" if found.retired_at is None else "retired"


def key_status(key: PublicKey) -> str:
    """``active`` or ``retired``, for a key recorded in a database."""
    return "active" if key.retired_at is None else "retired"
