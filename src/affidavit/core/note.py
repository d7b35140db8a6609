"""C2SP signed notes (``c2sp.org/signed-note``) with Ed25519, and timestamped Ed25519
checkpoint cosignatures (``c2sp.org/tlog-cosignature``, type 0x04).

    note      = text (ending in "\\n") || "\\n" || signature lines
    signature = "— " key name " " base64(4-byte key id || signature) "\\n"
    key id    = SHA-256(key name || "\\n" || type byte || public key)[:4]
    vkey      = key name "+" hex(key id) "+" base64(type byte || public key)

Ed25519 (type 0x01) signs the note text. A cosignature (type 0x04) signs
``"cosignature/v1\\ntime <T>\\n" || text`` and its signature bytes are the 8-byte big-endian
timestamp followed by the 64-byte Ed25519 signature.

Verification (:func:`open_note`) follows the spec: signatures from unknown keys are ignored; a
known key whose signature fails rejects the whole note; a note with no verified signature is
rejected. Notes are bounded (:data:`MAX_NOTE_BYTES`, :data:`MAX_SIGNATURES`) and may hold no
control character but newline.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from affidavit.core.errors import VerificationError

ED25519 = 0x01
COSIGNATURE_V1 = 0x04
MAX_NOTE_BYTES = 128 * 1024
MAX_SIGNATURES = 64
MAX_TIMESTAMP = 2**63 - 1
_DASH = "\u2014 "


class NoteError(VerificationError):
    """A note (or vkey) is malformed, or no trusted signature verifies it."""

    code = "note_invalid"
    default_hint = "Check the note and the verifier keys (vkeys) you passed."


def key_id(name: str, sig_type: int, public_key: bytes) -> bytes:
    """The 4-byte key id of a key (as the spec recommends, and requires for cosigners)."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public_key).digest()[:4]


def check_key_name(name: str) -> None:
    if not name or any(c.isspace() or c == "+" for c in name) or _has_control(name):
        raise NoteError(f"key name {name!r} is empty or holds a space, '+' or control character")


def _has_control(text: str) -> bool:
    return any(ord(c) < 0x20 and c != "\n" for c in text) or "\x7f" in text


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise NoteError(f"{what} is not valid base64") from None


@dataclass(frozen=True, slots=True)
class Signature:
    """One signature line of a note."""

    name: str
    key_id: bytes  # 4 bytes
    signature: bytes

    def line(self) -> str:
        return f"{_DASH}{self.name} {base64.b64encode(self.key_id + self.signature).decode()}\n"


@dataclass(frozen=True, slots=True)
class Note:
    """A parsed note: its text (signed bytes, ending in newline) and its signature lines."""

    text: str
    signatures: tuple[Signature, ...]

    def encode(self) -> str:
        return self.text + "\n" + "".join(s.line() for s in self.signatures)

    def with_signatures(self, extra: Iterable[Signature]) -> Note:
        """This note with ``extra`` signatures appended (one per key name and id)."""
        seen = {(s.name, s.key_id) for s in self.signatures}
        added = [s for s in extra if (s.name, s.key_id) not in seen]
        return Note(self.text, self.signatures + tuple(added))


def parse_note(data: bytes | str) -> Note:
    """Parse a signed note without verifying it.

    Raises:
        NoteError: not UTF-8, too large, a control character, no signature, a malformed line.
    """
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_NOTE_BYTES:
        raise NoteError(f"the note is {len(raw)} bytes, more than {MAX_NOTE_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NoteError("the note is not valid UTF-8") from None
    if _has_control(text):
        raise NoteError("the note holds a control character other than newline")
    split = text.rfind("\n\n")
    if split < 0:
        raise NoteError("the note has no blank line before its signatures")
    body, sig_block = text[: split + 1], text[split + 2 :]
    if not sig_block.endswith("\n"):
        raise NoteError("the note's last signature line does not end in a newline")
    lines = sig_block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"the note has {len(lines)} signatures, more than {MAX_SIGNATURES}")
    sigs: list[Signature] = []
    for line in lines:
        if not line.startswith(_DASH):
            raise NoteError(f"malformed signature line {line[:80]!r}")
        name, sep, b64 = line[len(_DASH) :].rpartition(" ")
        if not sep:
            raise NoteError(f"malformed signature line {line[:80]!r}")
        check_key_name(name)
        blob = _b64decode(b64, f"the signature of {name!r}")
        if len(blob) < 5:
            raise NoteError(f"the signature of {name!r} is too short")
        sigs.append(Signature(name, blob[:4], blob[4:]))
    return Note(body, tuple(sigs))


@dataclass(frozen=True, slots=True)
class Verifier:
    """A trusted key: name, type (Ed25519 note key or cosigner) and raw public key."""

    name: str
    sig_type: int
    public_key: bytes

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.sig_type, self.public_key)

    def vkey(self) -> str:
        material = base64.b64encode(bytes([self.sig_type]) + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{material}"

    def matches(self, sig: Signature) -> bool:
        return sig.name == self.name and sig.key_id == self.key_id

    def verify(self, text: str, sig: Signature) -> bool:
        """Whether ``sig`` (already matched by name and id) signs ``text``."""
        key = Ed25519PublicKey.from_public_bytes(self.public_key)
        if self.sig_type == ED25519:
            message, signature = text.encode(), sig.signature
        else:
            if len(sig.signature) != 72:
                return False
            timestamp = int.from_bytes(sig.signature[:8], "big")
            if timestamp > MAX_TIMESTAMP:
                return False
            message, signature = cosigned_message(text, timestamp), sig.signature[8:]
        try:
            key.verify(signature, message)
        except InvalidSignature:
            return False
        return True


def cosigned_message(text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


def cosignature_time(sig: Signature) -> int:
    """The timestamp of a cosignature's signature bytes."""
    return int.from_bytes(sig.signature[:8], "big")


def parse_vkey(text: str) -> Verifier:
    """A verifier from its vkey text (Ed25519 note keys and Ed25519 cosigner keys).

    Raises:
        NoteError: malformed, an unsupported type, or a key id that does not match.
    """
    parts = text.strip().split("+", 2)
    if len(parts) != 3:
        raise NoteError(f"vkey {text[:80]!r} is not name+keyid+key")
    name, hex_id, material = parts
    check_key_name(name)
    try:
        kid = bytes.fromhex(hex_id)
    except ValueError:
        raise NoteError(f"vkey key id {hex_id!r} is not hex") from None
    blob = _b64decode(material, "the vkey's key")
    if len(kid) != 4 or len(blob) != 33 or blob[0] not in (ED25519, COSIGNATURE_V1):
        raise NoteError(f"vkey {name!r} is not an Ed25519 key or cosigner key (types 0x01, 0x04)")
    verifier = Verifier(name, blob[0], blob[1:])
    if verifier.key_id != kid:
        raise NoteError(f"vkey {name!r}: the key id does not match the key")
    return verifier


@dataclass(frozen=True, slots=True)
class NoteSigner:
    """Signs notes (type 0x01) or cosigns checkpoints (type 0x04) with an Ed25519 key."""

    name: str
    private: Ed25519PrivateKey
    sig_type: int = ED25519

    def __post_init__(self) -> None:
        check_key_name(self.name)

    @property
    def verifier(self) -> Verifier:
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return Verifier(self.name, self.sig_type, raw)

    def sign(self, text: str, *, timestamp: int | None = None) -> Signature:
        kid = self.verifier.key_id
        if self.sig_type == ED25519:
            return Signature(self.name, kid, self.private.sign(text.encode()))
        ts = int(time.time()) if timestamp is None else timestamp
        sig = self.private.sign(cosigned_message(text, ts))
        return Signature(self.name, kid, ts.to_bytes(8, "big") + sig)


def sign_note(text: str, signer: NoteSigner) -> str:
    """A new note of ``text`` (must end in newline) signed by ``signer``."""
    if not text.endswith("\n") or _has_control(text):
        raise NoteError("note text must end in a newline and hold no control character")
    return Note(text, (signer.sign(text),)).encode()


def open_note(data: bytes | str, verifiers: Sequence[Verifier]) -> tuple[Note, list[Verifier]]:
    """Parse and verify a note; return it and the verifiers whose signatures hold.

    Raises:
        NoteError: malformed, a known key's signature fails, or no known key signed it.
    """
    note = parse_note(data)
    verified: list[Verifier] = []
    for sig in note.signatures:
        for v in verifiers:
            if v.matches(sig):
                if not v.verify(note.text, sig):
                    raise NoteError(f"the signature of {sig.name!r} does not verify")
                if v not in verified:
                    verified.append(v)
    if not verified:
        raise NoteError("no signature on the note is from a trusted key")
    return note, verified
