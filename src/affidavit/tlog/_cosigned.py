"""When a leaf was first seen by a witness: the earliest cosignature timestamp of a checkpoint
that covers it.

A witness's cosignature (``cosignature/v1``) signs a checkpoint together with the time it
cosigned. A checkpoint of size ``n`` covers the leaves ``0 .. n - 1``, so the earliest verified
cosignature time over the checkpoints whose size is above a leaf's index bounds when that leaf
— a job's seal — existed: no later than then. A seal whose ``sealed_at`` was moved back after
the fact still shows the time a witness first saw it. Only cosignatures that verify with a
given witness key count; without one, nothing is claimed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from affidavit.core.checkpoint import open_checkpoint
from affidavit.core.errors import AffidavitError, VerificationError
from affidavit.core.note import Verifier, cosignature_time

if TYPE_CHECKING:
    from affidavit.store import Store

MAX_CHECKPOINTS = 64  # stored cosigned checkpoints read for one leaf


@dataclass(frozen=True, slots=True)
class Cosigned:
    """A verified cosignature: its time (Unix seconds), the witness, the checkpoint's size."""

    time: int
    witness: str
    tree_size: int

    def iso(self) -> str:
        return datetime.fromtimestamp(self.time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def to_dict(self) -> dict[str, object]:
        return {
            "at": self.iso(),
            "unix": self.time,
            "witness": self.witness,
            "tree_size": self.tree_size,
        }


def cosignatures(note: str, log_key: Verifier, witnesses: Sequence[Verifier]) -> list[Cosigned]:
    """The verified witness cosignatures of a checkpoint note (none if the note does not verify
    as the log's)."""
    if not witnesses:
        return []
    try:
        checkpoint, opened, cosigned = open_checkpoint(note, log_key, witnesses)
    except VerificationError:
        return []
    return [
        Cosigned(cosignature_time(sig), sig.name, checkpoint.size)
        for sig in opened.signatures
        for w in cosigned
        if w.matches(sig)
    ]


def earliest_cosigned(
    index: int, notes: Iterable[str], log_key: Verifier, witnesses: Sequence[Verifier]
) -> Cosigned | None:
    """The earliest verified cosignature over the checkpoint ``notes`` that cover leaf
    ``index`` (``None``: none)."""
    found = [
        c for note in notes for c in cosignatures(note, log_key, witnesses) if c.tree_size > index
    ]
    return min(found, key=lambda c: (c.time, c.tree_size)) if found else None


def earliest_in_store(
    store: Store,
    index: int,
    shown: str,
    log_key: Verifier,
    witnesses: Sequence[Verifier],
) -> Cosigned | None:
    """:func:`earliest_cosigned` over the checkpoint ``shown`` (a proof's) and the cosigned
    checkpoints the store holds that cover leaf ``index`` (the first :data:`MAX_CHECKPOINTS`),
    each counted only if the store's consistency proof ties it to ``shown``'s tree."""
    from affidavit.core.merkle import verify_consistency
    from affidavit.tlog._log import TransparencyLog

    log = TransparencyLog(store)
    try:
        anchor, _, _ = open_checkpoint(shown, log_key)
    except VerificationError:
        return None
    with store.snapshot() as snap:
        sizes = snap.tlog_first_cosigned_sizes(index + 1, MAX_CHECKPOINTS)
    notes = [shown]
    for size in sizes:
        try:
            note = log.checkpoint(size)
            other, _, _ = open_checkpoint(note, log_key)
            old, new = sorted([other, anchor], key=lambda c: c.size)
            proof = log.consistency(old.size, new.size) if old.size < new.size else []
            verify_consistency(old.size, new.size, proof, old.root, new.root)
        except AffidavitError:
            continue  # (not this log's tree as the proof shows it: not counted)
        notes.append(note)
    return earliest_cosigned(index, notes, log_key, witnesses)
