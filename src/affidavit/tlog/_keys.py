"""The log's signing key and its origin.

The log signs checkpoints with an Ed25519 key of its own, separate from the seal key (a seal key
rotates; the log's key is the log's identity, which verifiers pin as a vkey). Where it lives
(first match): an explicit path; ``$AFFIDAVIT_LOG_KEY``; ``affidavit-log.key`` in the directory
of the seal key (see :func:`affidavit.record.default_key_path`). It is created on first
use, mode 0600, like the seal key. Every process that runs the sequencer (workers,
``affidavit serve``, ``affidavit log integrate``) must use the same key file.

The origin — the checkpoint's first line and the key's name — is chosen by the operator
(``$AFFIDAVIT_LOG_ORIGIN`` or ``--origin``) and fixed in the database by the first
integration; later runs naming another origin are refused. Without one, the origin is
``affidavit.local/log-<8 hex of the key id>``.
"""

from __future__ import annotations

import os
from pathlib import Path

from affidavit.core.errors import ConfigError
from affidavit.core.note import ED25519, NoteError, NoteSigner, Verifier, check_key_name
from affidavit.core.signing import SigningKey, default_key_path

LOG_KEY_ENV = "AFFIDAVIT_LOG_KEY"
LOG_ORIGIN_ENV = "AFFIDAVIT_LOG_ORIGIN"
LOG_KEY_FILE_NAME = "affidavit-log.key"


def default_log_key_path(db_url: str) -> Path:
    explicit = os.environ.get(LOG_KEY_ENV)
    if explicit:
        return Path(explicit).expanduser()
    return default_key_path(db_url).parent / LOG_KEY_FILE_NAME


def configured_origin(explicit: str | None = None) -> str | None:
    origin = explicit or os.environ.get(LOG_ORIGIN_ENV) or None
    if origin is not None:
        try:
            check_key_name(origin)
        except NoteError as exc:
            raise ConfigError(
                f"log origin {origin!r} is not usable: {exc.message}",
                hint="Name the log like a URL without scheme, e.g. example.com/affidavit-log.",
            ) from None
    return origin


class LogKey:
    """The log's key file, loaded (or created) on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: SigningKey | None = None

    @classmethod
    def for_url(cls, db_url: str, path: Path | str | None = None) -> LogKey:
        return cls(Path(path) if path is not None else default_log_key_path(db_url))

    def key(self) -> SigningKey:
        if self._key is None:
            self._key = SigningKey.load_or_create(self.path)
        return self._key

    def default_origin(self) -> str:
        return f"affidavit.local/log-{self.key().key_id[:8]}"

    def signer(self, origin: str) -> NoteSigner:
        return NoteSigner(origin, self.key().private, ED25519)

    def verifier(self, origin: str) -> Verifier:
        return self.signer(origin).verifier
