"""Payloads sealed under a data subject's key, so that erasing the key erases the data.

A job submitted with a ``subject`` has every value an agent or a person supplies (its input,
tool arguments and results, model requests and responses, signal payloads, approval comments,
stream values, error messages, its output) replaced, before it reaches the store, by a
*sealed-value envelope* (docs/formats.md, "Sealed values")::

    {"affidavit:sealed": "v1", "kid": "<16 hex: the data key's id>", "ct": "<base64url>"}

``ct`` is AES-SIV (RFC 5297, a 512-bit key) over JCS(value) with the associated data
``["affidavit:sealed:v1", job_id]``. AES-SIV is deterministic: the same value in the same job
seals to the same envelope, so a recovered run that makes the same call again computes the same
argument hash and idempotency key, and a value the log repeats (a signal's payload as the wait
step's output) is repeated as the same envelope — the hashes, chain, seal and log are taken over
the envelopes, which stay after the key is gone. Equal envelopes therefore reveal that two values
of one job are equal, nothing more; an envelope does not open in another job.

Data keys are stored wrapped by a master key (a :class:`KeyProvider`): the file named by
``$AFFIDAVIT_MASTER_KEY`` (:class:`FileKeyProvider`), or anything that implements the protocol
(a KMS). Subjects are stored only as a keyed hash (:meth:`KeyProvider.subject_id`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from affidavit.core.canonical import canonical, parse
from affidavit.core.errors import AffidavitError, ConfigError

SEALED = "affidavit:sealed"
SEALED_VERSION = "v1"
_AAD_LABEL = b"affidavit:sealed:v1"
#: What a reader shows in place of a sealed value whose key was erased.
ERASED = "[erased]"
MASTER_KEY_ENV = "AFFIDAVIT_MASTER_KEY"
#: The longest subject accepted (it is hashed, never stored).
MAX_SUBJECT = 256
_DATA_KEY_BYTES = 64  # AES-SIV with a 512-bit key (AES-256 for both halves)
_MASTER_KEY_BYTES = 32
_WRAP_LABEL = b"affidavit:data-key:v1"


class SubjectError(ConfigError):
    """A subject is malformed, or a subject's job cannot be written or read as asked."""

    code = "subject_error"
    default_hint = "A subject is 1 to 256 characters of text without control characters."


class SubjectNotFound(SubjectError):
    """No job was ever submitted for the subject in this store (or the master key is not the
    one its jobs were written under: the subject's id is a keyed hash)."""

    code = "subject_not_found"
    default_hint = "Check the subject's spelling, the database and the master key."


class SubjectBusy(SubjectError):
    """A job of the subject is not finished: erasing now would take the values it needs to go
    on. Nothing was changed."""

    code = "subject_busy"
    default_hint = (
        "Cancel the subject's unfinished jobs (`affidavit cancel JOB`, POST "
        "/api/jobs/{id}/cancel) or let them end, then erase again."
    )


class MasterKeyError(ConfigError):
    """The master key that wraps the subjects' data keys is missing, unreadable or wrong."""

    code = "master_key_error"
    default_hint = (
        f"Set {MASTER_KEY_ENV} to the path of a master key file (`affidavit subjects "
        "init-key FILE` makes one; keep it 0600 and apart from the database's backups)."
    )


class SealedValueError(AffidavitError):
    """A sealed value does not open under its job's data key: it was edited, moved to another
    job or place, or sealed under another key."""

    code = "sealed_value_invalid"
    default_hint = "The stored record was changed outside affidavit: run `affidavit verify`."


def check_subject(subject: object) -> str:
    """``subject`` as given, when it is text a subject can be: 1 to :data:`MAX_SUBJECT`
    characters, not blank, no control characters.

    Raises:
        SubjectError: naming what is wrong.
    """
    problem = None
    if not isinstance(subject, str):
        problem = f"is of type {type(subject).__name__}, not text"
    elif not subject.strip():
        problem = "is empty" if not subject else "is blank"
    elif len(subject) > MAX_SUBJECT:
        problem = f"has {len(subject)} characters (at most {MAX_SUBJECT})"
    elif any(ord(c) < 0x20 or ord(c) == 0x7F for c in subject):
        problem = "contains a control character"
    if problem is not None:
        raise SubjectError(f"the subject {problem}")
    assert isinstance(subject, str)
    return subject


def is_sealed(value: object) -> bool:
    """Whether ``value`` is a sealed-value envelope."""
    return type(value) is dict and value.get(SEALED) == SEALED_VERSION and len(value) == 3


class KeyProvider(Protocol):
    """Wraps and unwraps data keys under a master key, and hashes subjects with a key of its
    own. A KMS plugs in by implementing these three methods and ``key_id``."""

    @property
    def key_id(self) -> str:
        """An id of the master key, stored with every key it wrapped."""
        ...

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """``data_key`` encrypted (authenticated with ``context``)."""
        ...

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """The data key back. Raises :class:`MasterKeyError` if it does not open."""
        ...

    def subject_id(self, subject: str) -> str:
        """A keyed hash of ``subject`` (64 hex): what the store keeps instead of it."""
        ...


class FileKeyProvider:
    """A 32-byte master key in a file (hex, one line): data keys are wrapped with AES-256-GCM
    under it, subjects hashed with HMAC-SHA-256 under a key derived from it."""

    def __init__(self, key: bytes) -> None:
        if len(key) != _MASTER_KEY_BYTES:
            raise MasterKeyError(f"a master key has {_MASTER_KEY_BYTES} bytes, not {len(key)}")
        self._wrap = hmac.new(key, b"affidavit:wrap", hashlib.sha256).digest()
        self._index = hmac.new(key, b"affidavit:subject", hashlib.sha256).digest()
        self._id = hashlib.sha256(b"affidavit:master:" + key).hexdigest()[:16]

    @classmethod
    def load(cls, path: str | Path) -> FileKeyProvider:
        """The master key in the file at ``path``.

        Raises:
            MasterKeyError: no such file, not a key, or readable by others.
        """
        p = Path(path)
        try:
            mode = p.stat().st_mode
            text = p.read_text(encoding="ascii").strip()
        except (OSError, UnicodeError) as exc:
            raise MasterKeyError(f"cannot read the master key file {p}: {exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise MasterKeyError(
                f"the master key file {p} is readable by others (mode {mode & 0o777:o})",
                hint=f"chmod 600 {p}",
            )
        try:
            key = bytes.fromhex(text)
        except ValueError:
            raise MasterKeyError(f"the master key file {p} does not hold hex") from None
        return cls(key)

    @staticmethod
    def create(path: str | Path) -> FileKeyProvider:
        """Write a new random master key to ``path`` (0600; refuses an existing file)."""
        key = secrets.token_bytes(_MASTER_KEY_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise MasterKeyError(f"cannot create the master key file {path}: {exc}") from None
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(key.hex() + "\n")
        return FileKeyProvider(key)

    @property
    def key_id(self) -> str:
        return self._id

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = secrets.token_bytes(12)
        return nonce + AESGCM(self._wrap).encrypt(nonce, data_key, _WRAP_LABEL + context)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            return AESGCM(self._wrap).decrypt(wrapped[:12], wrapped[12:], _WRAP_LABEL + context)
        except (InvalidTag, ValueError):
            raise MasterKeyError(
                "a subject's data key does not open under this master key",
                hint=f"{MASTER_KEY_ENV} must name the master key the subject's key was made with.",
            ) from None

    def subject_id(self, subject: str) -> str:
        return hmac.new(self._index, subject.encode(), hashlib.sha256).hexdigest()


def master_key_provider(explicit: KeyProvider | str | Path | None = None) -> KeyProvider:
    """The key provider: ``explicit`` (a provider, or a key file's path), else the file named by
    ``$AFFIDAVIT_MASTER_KEY``.

    Raises:
        MasterKeyError: none is configured, or the file is not a usable key.
    """
    if explicit is not None and not isinstance(explicit, (str, Path)):
        return explicit
    path = explicit or os.environ.get(MASTER_KEY_ENV)
    if not path:
        raise MasterKeyError(
            f"jobs with a subject need a master key, and {MASTER_KEY_ENV} is not set"
        )
    return FileKeyProvider.load(path)


def new_data_key() -> bytes:
    """A fresh random data key for one subject."""
    return secrets.token_bytes(_DATA_KEY_BYTES)


def data_key_id(data_key: bytes) -> str:
    """The data key's public id (16 hex): which key a sealed value needs."""
    return hashlib.sha256(b"affidavit:data-key-id:" + data_key).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class JobCipher:
    """Seals and opens one job's values under its subject's data key."""

    job_id: str
    data_key: bytes

    @functools.cached_property
    def key_id(self) -> str:
        return data_key_id(self.data_key)

    @functools.cached_property
    def _siv(self) -> Any:  # one AES-SIV context per job, not one per value
        from cryptography.hazmat.primitives.ciphers.aead import AESSIV

        return AESSIV(self.data_key)

    def _aad(self) -> list[bytes]:
        return [_AAD_LABEL, self.job_id.encode()]

    def seal(self, value: Any) -> dict[str, str]:
        """``value``'s envelope (an envelope already is returned as it is)."""
        if is_sealed(value):
            return value  # type: ignore[no-any-return]
        ct = self._siv.encrypt(canonical(value), self._aad())
        return {SEALED: SEALED_VERSION, "kid": self.key_id, "ct": _b64(ct)}

    def open(self, envelope: dict[str, Any]) -> Any:
        """The value sealed in ``envelope``.

        Raises:
            SealedValueError: it does not open (edited, from another job, or another key).
        """
        from cryptography.exceptions import InvalidTag

        try:
            plain = self._siv.decrypt(_unb64(str(envelope["ct"])), self._aad())
            return parse(plain)
        except (InvalidTag, ValueError, KeyError, TypeError):
            raise SealedValueError(f"a sealed value of job {self.job_id} does not open") from None


# Where the values a person or an agent supplies sit in each event's payload.
SEALED_FIELDS: dict[str, tuple[str, ...]] = {
    "job_created": ("input",),
    "step_called": ("args",),
    "tool_invocation_finished": ("result", "error"),
    "node_finished": ("output", "error"),
    "wait_completed": ("payload",),
    "approval_recorded": ("comment",),
    "job_parked": ("detail",),
    "job_resumed": ("result", "note"),
    "step_compensated": ("compensation",),
    "job_completed": ("output",),
    "job_failed": ("error",),
    "stream_emitted": ("value",),
    "child_completed": ("output", "error"),
}

Each = Callable[[Any], Any]


def _decision(value: Any, each: Each) -> Any:
    """An approval's answer ``{"approved": bool, "comment"?}``: its comment replaced, its
    ``approved`` kept in the clear (the verifier checks it against the decisions)."""
    if value.get("comment") is None:
        return value
    return {**value, "comment": each(value["comment"])}


def _is_decision(value: Any) -> bool:
    return (
        type(value) is dict
        and type(value.get("approved")) is bool
        and set(value) <= {"approved", "comment"}
    )


def _walk(event_type: str, payload: dict[str, Any], each: Each) -> None:
    """Replace, in place, every value of ``payload`` a person or an agent supplied by
    ``each(value)`` (values that are ``None`` stay).

    An approval's answer (a ``wait_completed`` with ``decided_by``, and the approval step's
    output, which repeats it) keeps its ``approved`` in the clear and has only its comment
    replaced, like each decision's; a tool call's approval request (``job_waiting``) has the
    call's arguments replaced."""
    decided = payload.get("decided_by")
    if event_type == "wait_completed" and isinstance(decided, list):
        if isinstance(payload.get("payload"), dict):
            payload["payload"] = _decision(payload["payload"], each)
        payload["decided_by"] = [_decision(d, each) if isinstance(d, dict) else d for d in decided]
        return
    if event_type == "node_finished" and _is_decision(payload.get("output")):
        payload["output"] = _decision(payload["output"], each)
        if payload.get("error") is not None:
            payload["error"] = each(payload["error"])
        return
    for field in SEALED_FIELDS.get(event_type, ()):
        if payload.get(field) is not None:
            payload[field] = each(payload[field])
    call = payload.get("call")
    if event_type == "job_waiting" and isinstance(call, dict) and call.get("args") is not None:
        payload["call"] = {**call, "args": each(call["args"])}


def seal_payload(cipher: JobCipher, event_type: str, payload: dict[str, Any]) -> bool:
    """Seal, in place, the values of ``payload`` a person or an agent supplied (see
    :func:`_walk`); whether anything changed (a value sealed already stays as it is)."""
    sealed_any = False

    def seal(value: Any) -> Any:
        nonlocal sealed_any
        if is_sealed(value):
            return value
        sealed_any = True
        return cipher.seal(value)

    _walk(event_type, payload, seal)
    return sealed_any


def open_payload(
    open_value: Callable[[dict[str, Any]], Any], event_type: str, payload: dict[str, Any]
) -> dict[str, Any]:
    """A copy of ``payload`` with its sealed values opened by ``open_value(envelope)`` (which
    may answer :data:`ERASED`)."""
    out = dict(payload)
    _walk(event_type, out, lambda v: open_value(v) if is_sealed(v) else v)
    return out


def erased_opener(envelope: dict[str, Any]) -> Any:
    """What a reader shows for a value whose key is gone."""
    return ERASED
