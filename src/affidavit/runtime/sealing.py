"""The signing key and the seal a job gets when it reaches a terminal state.

Where the key lives (first match):

1. an explicit path (``Runtime(signing_key=...)``) or ``$AFFIDAVIT_SIGNING_KEY``;
2. SQLite: ``affidavit-signing.key`` in the directory of the database file;
3. PostgreSQL: ``$XDG_DATA_HOME/affidavit/affidavit-signing.key`` (default
   ``~/.local/share/affidavit/``). Team deployments set ``$AFFIDAVIT_SIGNING_KEY`` on every
   worker (one key shared through a secret store, or one per machine: every public key is
   recorded in the database, so all of them verify).

The file is a PKCS#8 PEM Ed25519 private key with mode 0600, created on first use (exclusively:
two processes starting at once end up with the same key). A key file readable by group or others
is refused, as ssh does. Private keys never enter the database; public keys do, and stay after a
rotation so that old seals keep verifying.

Crash safety: the seal is written in the same transaction as the job's terminal event (see
:meth:`Sealer.seal_txn`), so a terminal job without a seal is not a state a crash can leave
behind. Jobs that finished before seals existed can be sealed afterwards with
:func:`affidavit.verify.repair.seal_unsealed`, which verifies each log first.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from affidavit.core.errors import AffidavitError, ConfigError, JobNotFound
from affidavit.core.events import utc_now
from affidavit.core.seal import PublicKey, Seal, log_leaf, sign_seal
from affidavit.store import TERMINAL_STATUSES, Store, Transaction

KEY_ENV = "AFFIDAVIT_SIGNING_KEY"
KEY_FILE_NAME = "affidavit-signing.key"


class SigningKeyError(ConfigError):
    code = "signing_key_error"
    default_hint = (
        f"Point ${KEY_ENV} at a readable Ed25519 key file with mode 0600, or remove the variable "
        "to use the default location."
    )


def default_key_path(db_url: str) -> Path:
    """Where the signing key for the database at ``db_url`` lives (see the module docs)."""
    explicit = os.environ.get(KEY_ENV)
    if explicit:
        return Path(explicit).expanduser()
    if db_url.startswith("sqlite:///"):
        db_path = db_url[len("sqlite:///") :].split("?", 1)[0]
        return Path(db_path).expanduser().resolve().parent / KEY_FILE_NAME
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "affidavit" / KEY_FILE_NAME


@dataclass(frozen=True, slots=True)
class SigningKey:
    """An Ed25519 private key (and the file it came from)."""

    private: Ed25519PrivateKey
    path: Path | None = None

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_raw(self) -> bytes:
        return self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def public(self) -> PublicKey:
        return PublicKey.from_raw(self.public_raw)

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def pem(self) -> bytes:
        return self.private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())

    def seal(self, job_id: str, event_count: int, event_chain_root_hash: str) -> Seal:
        """Sign a seal now."""
        return sign_seal(
            self.private,
            job_id=job_id,
            event_count=event_count,
            event_chain_root_hash=event_chain_root_hash,
            sealed_at=utc_now(),
        )

    # --- files ----------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        """Read a key file.

        Raises:
            SigningKeyError: missing, readable by others, unreadable, or not an Ed25519 key.
        """
        try:
            mode = path.stat().st_mode
            if mode & 0o077:
                raise SigningKeyError(
                    f"signing key {str(path)!r} is accessible by group or others "
                    f"(mode {mode & 0o777:04o})",
                    hint=f"Restrict it: chmod 600 {path}",
                )
            data = path.read_bytes()
        except OSError as exc:
            raise SigningKeyError(f"cannot read signing key {str(path)!r}: {exc}") from exc
        try:
            private = load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise SigningKeyError(
                f"{str(path)!r} is not an unencrypted PEM private key: {exc}"
            ) from exc
        if not isinstance(private, Ed25519PrivateKey):
            raise SigningKeyError(f"{str(path)!r} holds a {type(private).__name__}, not Ed25519")
        return cls(private, path)

    @classmethod
    def load_or_create(cls, path: Path) -> SigningKey:
        """Load the key at ``path``, creating it (mode 0600) if there is none. Concurrent
        creators agree on one key: the file appears atomically and only once."""
        if not path.exists():
            new = cls.generate()
            try:
                _write_exclusive(path, new.pem())
            except FileExistsError:
                pass  # another process won the race: use its key
            except OSError as exc:
                raise SigningKeyError(f"cannot create signing key {str(path)!r}: {exc}") from exc
        return cls.load(path)


def _write_temp(path: Path, data: bytes) -> Path:
    """``data`` in a new 0600 file next to ``path``, synced."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_exclusive(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data`` atomically; ``FileExistsError`` if it exists."""
    tmp = _write_temp(path, data)
    try:
        os.link(tmp, path)  # atomic, and fails if someone else created it first
    finally:
        tmp.unlink()
    _sync_dir(path.parent)


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
        self, tx: Transaction, job_id: str, *, head: tuple[int, str] | None = None
    ) -> Seal:
        """Seal ``job_id`` inside ``tx``, the transaction that appended its terminal event: the
        seal covers the log as this transaction leaves it. Registers the public key too.

        ``head``: the log's last version and chain hash (hex) as this transaction leaves it,
        when the caller knows them because it appended the last event itself (a run); read
        from the job otherwise.

        Raises:
            JobNotFound: no such job.
        """
        key = self.key()
        if head is None:
            job = tx.get_job(job_id)
            if job is None:
                raise JobNotFound(job_id)
            head = (job.version, job.head_hash or "")
        seal = key.seal(job_id, *head)
        tx.key_register(key.public, created_at=seal.sealed_at)
        if tx.seal_insert(seal):
            # the seal's transparency-log leaf, queued with it: a crash before the sequencer
            # integrates it loses nothing
            tx.tlog_enqueue(job_id, log_leaf(seal), time.time())
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
            try:
                tmp = _write_temp(self.path, new.pem())
            except OSError as exc:
                raise SigningKeyError(f"cannot write a new key next to {self.path}: {exc}") from exc
            try:
                # The new public key is recorded before anything can sign with it.
                with store.transaction(durable=True) as tx:
                    now = utc_now()
                    if old is not None:
                        tx.key_register(old.public, created_at=now)
                        tx.key_retire(old.key_id, retired_at=now)
                    tx.key_register(new.public, created_at=now)
                if old is not None:
                    archive = self.path.with_name(f"{self.path.name}.retired-{old.key_id}")
                    if not archive.exists():
                        os.link(self.path, archive)
                os.replace(tmp, self.path)
                _sync_dir(self.path.parent)
            except OSError as exc:
                raise SigningKeyError(f"cannot replace {self.path}: {exc}") from exc
            finally:
                if tmp.exists():
                    tmp.unlink()
            self._key = SigningKey(new.private, self.path)
            return old, self._key

    def register(self, store: Store) -> SigningKey:
        """Load (or create) the key and record its public key in ``store``."""
        key = self.key()
        with store.transaction(durable=True) as tx:
            tx.key_register(key.public, created_at=utc_now())
        return key
