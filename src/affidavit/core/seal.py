"""Seals: an Ed25519 signature over a finished job's chain head and length.

    message v1 = JCS({"job_id", "event_count", "event_chain_root_hash", "sealed_at", "key_id"})
    message v2 = JCS({"version": 2, "job_id", "event_count", "event_chain_root_hash",
                      "events_root", "sealed_at", "key_id"})
    signature  = Ed25519(private key, message)
    key_id     = first 16 hex chars of hex(SHA-256(raw 32-byte public key))
    events_root = hex(RFC 6962 Merkle root over the leaves H_1 .. H_n), each leaf the raw 32-byte
                  chain hash of one event in version order (see :func:`events_root`)

A v2 seal also commits to a Merkle tree over the job's events, so that one event can be shown
with an inclusion proof against the sealed root without the others (``affidavit disclose``).
New seals are v2; v1 seals (no ``version`` field) keep verifying as they always did.

A bare hash chain detects edits, insertions, deletions and reordering inside the log, but not a
truncated tail or a log re-chained from scratch: whoever can write the database can recompute
every hash. A seal fixes the length and the head at the moment the job finished, with a key the
database does not hold. Public keys and signatures travel as standard base64 of the raw bytes
(as in proof packs); hashes and key ids are lowercase hex.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from affidavit.core.canonical import canonical
from affidavit.core.merkle import root_of

if TYPE_CHECKING:  # (cryptography is imported where a seal is signed or checked: a command
    # that only reads seals, as `jobs show`, does not load it)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ALGORITHM = "ed25519"
PUBLIC_KEY_BYTES = 32
SEAL_VERSIONS = (1, 2)
SEAL_VERSION = 2  # what new seals are
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


def events_root(chain_hashes: Sequence[bytes]) -> str:
    """hex RFC 6962 root of the tree whose leaves are the events' raw chain hashes H_1 .. H_n
    (leaf hash ``SHA-256(0x00 ‖ H_i)``; the empty tree's root for no events)."""
    return root_of(chain_hashes).hex()


def key_id_for(public_raw: bytes) -> str:
    """The key id of a raw 32-byte Ed25519 public key."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    """Strict standard base64 (padding required, no stray characters).

    Raises:
        ValueError: not valid base64.
    """
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"not valid base64: {exc}") from None


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A seal-verification key as the database (or a verifier's trust list) holds it."""

    key_id: str
    public_key: bytes  # raw 32 bytes
    created_at: str | None = None
    retired_at: str | None = None

    @classmethod
    def from_raw(cls, public_raw: bytes) -> PublicKey:
        return cls(key_id_for(public_raw), public_raw)

    @property
    def public_key_b64(self) -> str:
        return b64(self.public_key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "algorithm": ALGORITHM,
            "public_key": self.public_key_b64,
            "created_at": self.created_at,
            "retired_at": self.retired_at,
        }


@dataclass(frozen=True, slots=True)
class Seal:
    """A signed statement: job ``job_id`` ended with ``event_count`` events whose chain root is
    ``event_chain_root_hash``; signed at ``sealed_at`` by key ``key_id``."""

    job_id: str
    event_count: int
    event_chain_root_hash: str
    sealed_at: str
    key_id: str
    signature: str  # base64 of the raw 64-byte Ed25519 signature
    algorithm: str = ALGORITHM
    version: int = 1
    events_root: str | None = None  # v2: hex Merkle root over the events' chain hashes

    def message(self) -> bytes:
        """The exact bytes that are signed."""
        return seal_message(
            self.job_id,
            self.event_count,
            self.event_chain_root_hash,
            self.sealed_at,
            self.key_id,
            events_root=self.events_root if self.version >= 2 else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The seal as JSON; a v1 seal exactly as before v2 existed (no ``version``), so that its
        hash, and so its transparency-log leaf, are unchanged."""
        doc: dict[str, Any] = {
            "job_id": self.job_id,
            "event_count": self.event_count,
            "event_chain_root_hash": self.event_chain_root_hash,
            "sealed_at": self.sealed_at,
            "key_id": self.key_id,
            "algorithm": self.algorithm,
            "signature": self.signature,
        }
        if self.version != 1:
            doc["version"] = self.version
            doc["events_root"] = self.events_root
        return doc

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Seal:
        """A seal from :meth:`to_dict` output.

        Raises:
            ValueError: a field is missing or has the wrong type.
        """
        try:
            seal = cls(
                job_id=data["job_id"],
                event_count=data["event_count"],
                event_chain_root_hash=data["event_chain_root_hash"],
                sealed_at=data["sealed_at"],
                key_id=data["key_id"],
                signature=data["signature"],
                algorithm=data.get("algorithm", ALGORITHM),
                version=data.get("version", 1),
                events_root=data.get("events_root"),
            )
        except KeyError as exc:
            raise ValueError(f"seal lacks {exc.args[0]!r}") from None
        for name in ("job_id", "event_chain_root_hash", "sealed_at", "key_id", "signature"):
            if not isinstance(getattr(seal, name), str):
                raise ValueError(f"seal field {name!r} must be a string")
        if type(seal.event_count) is not int:
            raise ValueError("seal field 'event_count' must be an integer")
        if type(seal.version) is not int or seal.version not in SEAL_VERSIONS:
            raise ValueError(f"unknown seal version {seal.version!r}")
        if seal.version == 1 and "version" in data:
            raise ValueError("a v1 seal has no 'version' field")
        if seal.version == 1 and seal.events_root is not None:
            raise ValueError("a v1 seal has no 'events_root'")
        if seal.version >= 2 and not (
            isinstance(seal.events_root, str) and _HEX64.match(seal.events_root)
        ):
            raise ValueError("seal field 'events_root' must be 64 lowercase hex digits")
        return seal


def seal_message(
    job_id: str,
    event_count: int,
    event_chain_root_hash: str,
    sealed_at: str,
    key_id: str,
    *,
    events_root: str | None = None,
) -> bytes:
    """JCS of the sealed fields: the five of v1, or with ``events_root`` those of v2 (which
    add ``"version": 2`` and ``events_root``)."""
    fields: dict[str, Any] = {
        "job_id": job_id,
        "event_count": event_count,
        "event_chain_root_hash": event_chain_root_hash,
        "sealed_at": sealed_at,
        "key_id": key_id,
    }
    if events_root is not None:
        fields["version"] = 2
        fields["events_root"] = events_root
    return canonical(fields)


def sign_seal(
    private_key: Ed25519PrivateKey,
    *,
    job_id: str,
    event_count: int,
    event_chain_root_hash: str,
    sealed_at: str,
    events_root: str | None = None,
) -> Seal:
    """Sign a seal with ``private_key``; its key id is derived from the public half. With
    ``events_root`` (hex, from :func:`events_root`) a v2 seal, else a v1 seal."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public_raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    key_id = key_id_for(public_raw)
    message = seal_message(
        job_id, event_count, event_chain_root_hash, sealed_at, key_id, events_root=events_root
    )
    return Seal(
        job_id=job_id,
        event_count=event_count,
        event_chain_root_hash=event_chain_root_hash,
        sealed_at=sealed_at,
        key_id=key_id,
        signature=b64(private_key.sign(message)),
        version=1 if events_root is None else 2,
        events_root=events_root,
    )


def check_signature(seal: Seal, public_raw: bytes) -> str:
    """Check ``seal``'s signature against a raw public key; return ``""`` when it holds, else
    the reason it does not."""
    if seal.algorithm != ALGORITHM:
        return f"unsupported seal algorithm {seal.algorithm!r}"
    if len(public_raw) != PUBLIC_KEY_BYTES:
        return f"public key {seal.key_id} is not {PUBLIC_KEY_BYTES} bytes"
    if key_id_for(public_raw) != seal.key_id:
        return f"public key does not match key id {seal.key_id}"
    try:
        signature = unb64(seal.signature)
    except ValueError as exc:
        return f"seal signature is {exc}"
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, seal.message())
    except InvalidSignature:
        return f"seal signature does not verify with key {seal.key_id}"
    return ""


LOG_LEAF_TYPE = "affidavit.seal/v1"


def seal_sha256(seal: Seal) -> str:
    """hex SHA-256 of JCS(the seal as :meth:`Seal.to_dict` writes it, signature included; a v2
    seal's ``version`` and ``events_root`` with it)."""
    return hashlib.sha256(canonical(seal.to_dict())).hexdigest()


def log_leaf(seal: Seal) -> bytes:
    """The transparency-log leaf of a seal (its bytes are what the tree hashes, with the RFC
    6962 leaf prefix): JCS of the job id, the sealed length and chain head, the key id and the
    seal's hash.

    ``{"type": "affidavit.seal/v1", "job_id", "event_count", "event_chain_root_hash",
    "key_id", "seal_sha256"}``
    """
    return canonical(
        {
            "type": LOG_LEAF_TYPE,
            "job_id": seal.job_id,
            "event_count": seal.event_count,
            "event_chain_root_hash": seal.event_chain_root_hash,
            "key_id": seal.key_id,
            "seal_sha256": seal_sha256(seal),
        }
    )
