"""The Ed25519 key that signs seals and proof packs, and where it lives (first match):

1. an explicit path (``Runtime(signing_key=...)``) or ``$AFFIDAVIT_SIGNING_KEY``;
2. SQLite: ``affidavit-signing.key`` in the directory of the database file;
3. PostgreSQL: ``$XDG_DATA_HOME/affidavit/affidavit-signing.key`` (default
   ``~/.local/share/affidavit/``). Team deployments set ``$AFFIDAVIT_SIGNING_KEY`` on every
   worker (one key shared through a secret store, or one per machine, each registered by an
   operator with ``affidavit keys trust``: the database accepts the keys registered in it
   only, the first key that seals in an empty database being registered by itself).

The file is a PKCS#8 PEM Ed25519 private key with mode 0600, created on first use (exclusively:
two processes starting at once end up with the same key). A key file readable by group or others
is refused, as ssh does. Private keys never enter the database; public keys do, and stay after a
rotation so that old seals keep verifying. The record's :class:`~affidavit.record.Sealer`
signs with it; packs and the CLI read it from here.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from affidavit.core.errors import ConfigError
from affidavit.core.events import utc_now
from affidavit.core.seal import PUBLIC_KEY_BYTES, PublicKey, Seal, sign_seal, unb64

if TYPE_CHECKING:  # (cryptography is imported on a key's first use: see affidavit.core.seal)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

KEY_ENV = "AFFIDAVIT_SIGNING_KEY"
KEY_FILE_NAME = "affidavit-signing.key"
MAX_KEY_FILE_BYTES = 64 * 1024


class SigningKeyError(ConfigError):
    code = "signing_key_error"
    default_hint = (
        f"Point ${KEY_ENV} at a readable Ed25519 key file with mode 0600, or remove the variable "
        "to use the default location."
    )


class SealKeyRefused(ConfigError):
    """The database does not accept this key for new seals: another key was registered
    first, or this one was retired."""

    code = "seal_key_refused"
    default_hint = (
        "Register this host's public key from an operator's shell: `affidavit keys trust "
        "KEYFILE_OR_PUBKEY` (the base64 that `affidavit keys show` prints here), or run "
        "`affidavit keys rotate` here to make a new key and register it as current (keys "
        "registered before stay accepted for verifying their seals). `affidavit keys list` "
        "shows the keys this database accepts."
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
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    @property
    def public_raw(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def public(self) -> PublicKey:
        return PublicKey.from_raw(self.public_raw)

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def pem(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import (
            Encoding,
            NoEncryption,
            PrivateFormat,
        )

        return self.private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())

    def seal(
        self,
        job_id: str,
        event_count: int,
        event_chain_root_hash: str,
        events_root: str | None = None,
    ) -> Seal:
        """Sign a seal now: v2 with ``events_root`` (see :func:`affidavit.core.seal.events_root`),
        else v1."""
        return sign_seal(
            self.private,
            job_id=job_id,
            event_count=event_count,
            event_chain_root_hash=event_chain_root_hash,
            sealed_at=utc_now(),
            events_root=events_root,
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
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

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


def stage_key_file(path: Path, key: SigningKey) -> Path:
    """Write ``key`` to a temporary file beside ``path`` (mode 0600, synced), for
    :func:`install_key_file` to move into place: the first half of a key rotation.

    Raises:
        SigningKeyError: the file cannot be written.
    """
    try:
        return _write_temp(path, key.pem())
    except OSError as exc:
        raise SigningKeyError(f"cannot write a new key next to {path}: {exc}") from exc


def install_key_file(path: Path, staged: Path, retired: SigningKey | None) -> None:
    """Replace the key file ``path`` with ``staged`` (from :func:`stage_key_file`), keeping the
    retired key's file beside it as ``<name>.retired-<key_id>``; the directory is synced.

    Raises:
        SigningKeyError: the files cannot be linked or replaced.
    """
    try:
        if retired is not None:
            archive = path.with_name(f"{path.name}.retired-{retired.key_id}")
            if not archive.exists():
                os.link(path, archive)
        os.replace(staged, path)
        _sync_dir(path.parent)
    except OSError as exc:
        raise SigningKeyError(f"cannot replace {path}: {exc}") from exc


_PUBLIC_KEY_HINT = (
    "Give the base64 public key that `affidavit keys show` prints on the host that holds the "
    "key, a PEM public key file, or the key file itself (a PKCS#8 PEM private key, mode 0600)."
)


def public_key_of(text: str) -> PublicKey:
    """The Ed25519 public key named by ``text``: a file holding a PEM public or private key,
    else the standard base64 of the raw 32-byte public key.

    Raises:
        SigningKeyError: neither, or not an Ed25519 key.
    """
    path = Path(text).expanduser()
    if path.is_file():
        return _public_key_file(path)
    try:
        raw = unb64(text.strip())
    except ValueError as exc:
        raise SigningKeyError(
            f"{text[:100]!r} is neither a key file nor a base64 public key ({exc})",
            hint=_PUBLIC_KEY_HINT,
        ) from None
    if len(raw) != PUBLIC_KEY_BYTES:
        raise SigningKeyError(
            f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, not {len(raw)}",
            hint=_PUBLIC_KEY_HINT,
        )
    return PublicKey.from_raw(raw)


def _public_key_file(path: Path) -> PublicKey:
    try:
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            raise SigningKeyError(
                f"{str(path)!r} is larger than a key file ({MAX_KEY_FILE_BYTES} bytes)",
                hint=_PUBLIC_KEY_HINT,
            )
        data = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"cannot read {str(path)!r}: {exc}", hint=_PUBLIC_KEY_HINT) from exc
    if b"PRIVATE KEY" in data:
        return SigningKey.load(path).public
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )

    try:
        public = load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(
            f"{str(path)!r} is not a PEM public or private key: {exc}", hint=_PUBLIC_KEY_HINT
        ) from exc
    if not isinstance(public, Ed25519PublicKey):
        raise SigningKeyError(
            f"{str(path)!r} holds a {type(public).__name__}, not Ed25519", hint=_PUBLIC_KEY_HINT
        )
    return PublicKey.from_raw(public.public_bytes(Encoding.Raw, PublicFormat.Raw))
