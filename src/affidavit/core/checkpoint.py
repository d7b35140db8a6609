"""C2SP checkpoints (``c2sp.org/tlog-checkpoint``) and ``c2sp.org/tlog-proof@v1`` files.

    checkpoint text = origin "\\n" tree size "\\n" base64(root) "\\n" (extension lines)
    tlog-proof      = "c2sp.org/tlog-proof@v1\\n" ["extra " base64 "\\n"] "index " N "\\n"
                      (base64(hash) "\\n")* "\\n" checkpoint note (verbatim)

:func:`verify_tlog_proof` is the offline check: the checkpoint is signed by the log's key for
its origin, at least ``min_witnesses`` of the given witness keys cosigned it, and the inclusion
proof binds the leaf to its root.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from dataclasses import dataclass

from affidavit.core.merkle import HASH_SIZE, verify_inclusion
from affidavit.core.note import (
    COSIGNATURE_V1,
    ED25519,
    MAX_NOTE_BYTES,
    Note,
    NoteError,
    Verifier,
    open_note,
    parse_note,
)

PROOF_HEADER = "c2sp.org/tlog-proof@v1"
MAX_PROOF_HASHES = 64
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,19}")


def _decimal(text: str, what: str) -> int:
    if not _DECIMAL.fullmatch(text):
        raise NoteError(f"{what} {text[:40]!r} is not a decimal number without leading zeros")
    return int(text)


def _hash(text: str, what: str) -> bytes:
    try:
        value = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise NoteError(f"{what} is not valid base64") from None
    if len(value) != HASH_SIZE:
        raise NoteError(f"{what} is {len(value)} bytes, not {HASH_SIZE}")
    return value


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A log's tree head: origin, size and root hash (plus opaque extension lines)."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode()]
        return "\n".join([*lines, *self.extensions]) + "\n"

    @classmethod
    def from_text(cls, text: str) -> Checkpoint:
        """Parse checkpoint note text.

        Raises:
            NoteError: fewer than three lines, an empty line, a malformed size or root.
        """
        if not text.endswith("\n"):
            raise NoteError("checkpoint text does not end in a newline")
        lines = text[:-1].split("\n")
        if len(lines) < 3 or any(not line for line in lines):
            raise NoteError("a checkpoint needs origin, size and root hash lines, none empty")
        size = _decimal(lines[1], "checkpoint tree size")
        root = _hash(lines[2], "checkpoint root hash")
        return cls(lines[0], size, root, tuple(lines[3:]))


def open_checkpoint(
    data: bytes | str,
    log_key: Verifier,
    witnesses: Sequence[Verifier] = (),
    *,
    min_witnesses: int = 0,
) -> tuple[Checkpoint, Note, list[Verifier]]:
    """Verify a checkpoint note: the log's signature (its key name must be the origin), and
    cosignatures; return the checkpoint, the note and the witnesses whose cosignatures hold.

    Raises:
        NoteError: malformed, not signed by the log, a failing known signature, or fewer than
            ``min_witnesses`` valid cosignatures.
    """
    if log_key.sig_type != ED25519:
        raise NoteError(f"the log key {log_key.name!r} is not an Ed25519 note key")
    for w in witnesses:
        if w.sig_type != COSIGNATURE_V1:
            raise NoteError(f"witness key {w.name!r} is not a cosigner key (type 0x04)")
    note, verified = open_note(data, [log_key, *witnesses])
    if log_key not in verified:
        raise NoteError(f"the checkpoint is not signed by the log key {log_key.name!r}")
    checkpoint = Checkpoint.from_text(note.text)
    if checkpoint.origin != log_key.name:
        raise NoteError(
            f"the checkpoint's origin {checkpoint.origin!r} is not the log key's name "
            f"{log_key.name!r}"
        )
    cosigned = [v for v in verified if v is not log_key and v != log_key]
    if len(cosigned) < min_witnesses:
        raise NoteError(
            f"the checkpoint has {len(cosigned)} valid witness cosignature(s), "
            f"{min_witnesses} required"
        )
    return checkpoint, note, cosigned


@dataclass(frozen=True, slots=True)
class TlogProof:
    """A ``c2sp.org/tlog-proof@v1``: leaf index, inclusion proof and the checkpoint note."""

    index: int
    proof: tuple[bytes, ...]
    checkpoint: str  # the signed note, verbatim
    extra: bytes | None = None

    def encode(self) -> str:
        lines = [PROOF_HEADER]
        if self.extra is not None:
            lines.append("extra " + base64.b64encode(self.extra).decode())
        lines.append(f"index {self.index}")
        lines.extend(base64.b64encode(h).decode() for h in self.proof)
        return "\n".join(lines) + "\n\n" + self.checkpoint

    @classmethod
    def parse(cls, data: bytes | str) -> TlogProof:
        """Parse a tlog-proof (the checkpoint is parsed, not verified).

        Raises:
            NoteError: malformed or oversized.
        """
        raw = data.encode() if isinstance(data, str) else data
        if len(raw) > MAX_NOTE_BYTES + 4096:
            raise NoteError(f"the tlog-proof is {len(raw)} bytes, too large")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise NoteError("the tlog-proof is not valid UTF-8") from None
        head, sep, checkpoint = text.partition("\n\n")
        if not sep:
            raise NoteError("the tlog-proof has no blank line before its checkpoint")
        lines = head.split("\n")
        if lines[0] != PROOF_HEADER:
            raise NoteError(f"the first line is not {PROOF_HEADER!r}")
        rest = lines[1:]
        extra = None
        if rest and rest[0].startswith("extra "):
            try:
                extra = base64.b64decode(rest[0][6:].encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError, ValueError):
                raise NoteError("the extra line is not valid base64") from None
            rest = rest[1:]
        if not rest or not rest[0].startswith("index "):
            raise NoteError("the tlog-proof lacks its index line")
        index = _decimal(rest[0][6:], "index")
        if len(rest) - 1 > MAX_PROOF_HASHES:
            raise NoteError(f"the inclusion proof has more than {MAX_PROOF_HASHES} hashes")
        proof = tuple(_hash(h, f"inclusion proof hash {i}") for i, h in enumerate(rest[1:]))
        parse_note(checkpoint)
        return cls(index, proof, checkpoint, extra)


def verify_tlog_proof(
    proof: TlogProof,
    leaf_hash: bytes,
    log_key: Verifier,
    witnesses: Sequence[Verifier] = (),
    *,
    min_witnesses: int = 0,
) -> tuple[Checkpoint, list[Verifier]]:
    """The offline check of a tlog-proof for the leaf with hash ``leaf_hash`` (steps 2-4 of the
    spec); returns the checkpoint and the witnesses that cosigned it.

    Raises:
        NoteError: the checkpoint is not signed as required.
        ProofError: the inclusion proof does not bind the leaf to the checkpoint's root.
    """
    checkpoint, _note, cosigned = open_checkpoint(
        proof.checkpoint, log_key, witnesses, min_witnesses=min_witnesses
    )
    verify_inclusion(leaf_hash, proof.index, checkpoint.size, list(proof.proof), checkpoint.root)
    return checkpoint, cosigned
