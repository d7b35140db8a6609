"""Reading the log: checkpoints, inclusion and consistency proofs, tiles and entry bundles,
a job's ``c2sp.org/tlog-proof@v1``, and witness cosignatures handed back to the log.

Every read is one snapshot: a proof and the checkpoint it is against come from one moment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from affidavit.core.checkpoint import Checkpoint, TlogProof
from affidavit.core.errors import AffidavitError, NotFound
from affidavit.core.events import utc_now
from affidavit.core.merkle import (
    Node,
    consistency_ranges,
    hash_ranges,
    inclusion_ranges,
    nodes_for,
)
from affidavit.core.note import COSIGNATURE_V1, NoteError, open_note, parse_note, parse_vkey
from affidavit.store import Store

TILE_WIDTH = 256
MAX_COSIGNATURES = 16
_TILE_INDEX = re.compile(r"(?:x[0-9]{3}/)*[0-9]{3}")
MAX_TREE_SIZE = 2**63 - 1  # tree sizes are signed 64-bit here (c2sp.org/tlog-checkpoint)
_MAX_INDEX_CHARS = 7 * 5  # 2**63 / 256 has 17 digits: 6 groups; one more to say "too far"


class LogError(AffidavitError):
    """A request the log cannot answer (empty log, a size it does not have)."""

    code = "log_error"
    default_hint = "Run `affidavit log integrate`, then `affidavit log checkpoint` for the size."


class NotInLog(NotFound):
    """The job has no leaf in the log (yet)."""

    code = "not_in_log"
    default_hint = (
        "Only sealed (finished) jobs are logged; a new seal is integrated within about a second "
        "by a running worker or server, or now by `affidavit log integrate`."
    )


@dataclass(frozen=True, slots=True)
class TilePath:
    """A parsed tlog-tiles path: ``level`` (``None`` for an entry bundle), index, width."""

    level: int | None
    index: int
    width: int | None


def parse_tile_path(path: str) -> TilePath:
    """``<L>/<N>[.p/<W>]`` or ``entries/<N>[.p/<W>]`` (the part after ``tile/``), in the spec's
    one encoding: ``N`` in 3-digit groups, all but the last prefixed with ``x``, no group of
    leading zeros; and a tile that a tree of at most 2**63 - 1 leaves can have (its end index
    ``(N + 1) * 256**(L+1)`` at most 2**63 - 1, so that no index reaches the store unbounded).

    Raises:
        LogError: not a tile path of the spec's form, or past any tree.
    """
    width: int | None = None
    if ".p/" in path:
        path, _, w = path.partition(".p/")
        if not re.fullmatch(r"[1-9][0-9]{0,2}", w) or int(w) > 255:
            raise LogError(f"bad partial tile width {w[:8]!r}")
        width = int(w)
    head, _, rest = path.partition("/")
    if head == "entries":
        level: int | None = None
    elif re.fullmatch(r"0|[1-9][0-9]?", head) and int(head) <= 63:
        level = int(head)
    else:
        raise LogError(f"bad tile level {head[:8]!r}")
    if len(rest) > _MAX_INDEX_CHARS or not _TILE_INDEX.fullmatch(rest):
        raise LogError(f"bad tile index {rest[:40]!r}")
    index = int(rest.replace("x", "").replace("/", ""))
    if (index + 1) * TILE_WIDTH ** ((level or 0) + 1) > MAX_TREE_SIZE:
        raise LogError(f"tile index {index} is past any tree of at most 2**63 - 1 leaves")
    if tile_path(level, index, width) != f"{head}/{rest}" + (f".p/{width}" if width else ""):
        raise LogError(f"tile index {rest[:40]!r} is not in its one encoding (leading zeros)")
    return TilePath(level, index, width)


def tile_path(level: int | None, index: int, width: int | None = None) -> str:
    digits = str(index)
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[k : k + 3] for k in range(0, len(digits), 3)]
    parts = [f"x{g}" for g in groups[:-1]] + [groups[-1]]
    name = "entries" if level is None else str(level)
    return f"{name}/{'/'.join(parts)}" + (f".p/{width}" if width else "")


class TransparencyLog:
    """The read side of the log over ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def origin(self) -> str:
        with self.store.snapshot() as snap:
            origin = snap.tlog_state().origin
        if origin is None:
            raise LogError("the log has no checkpoint yet")
        return origin

    def checkpoint(self, size: int | None = None) -> str:
        """The checkpoint note at ``size`` (the latest by default), with the witness
        cosignatures stored for it.

        Raises:
            LogError: no checkpoint (at that size).
        """
        with self.store.snapshot() as snap:
            found = snap.tlog_checkpoint(size)
            if found is None:
                what = "yet" if size is None else f"at size {size}"
                raise LogError(f"the log has no checkpoint {what}")
            return _with_cosignatures(found[1], snap.tlog_cosignatures(found[0]))

    def size(self) -> int:
        with self.store.snapshot() as snap:
            found = snap.tlog_checkpoint()
        return found[0] if found else 0

    def consistency(self, old_size: int, new_size: int) -> list[bytes]:
        """The RFC 9162 consistency proof between two sizes of the tree.

        Raises:
            LogError: a size is not positive, out of order, or past the tree.
        """
        with self.store.snapshot() as snap:
            size = snap.tlog_state().size
            if not 0 < old_size <= new_size <= size:
                raise LogError(
                    f"no consistency proof from {old_size} to {new_size}: sizes must satisfy "
                    f"0 < old ≤ new ≤ {size} (the tree's size)"
                )
            ranges = consistency_ranges(old_size, new_size)
            return hash_ranges(ranges, _nodes(snap.tlog_nodes(nodes_for(ranges))))

    def inclusion(self, index: int, size: int) -> list[bytes]:
        with self.store.snapshot() as snap:
            if not 0 <= index < size <= snap.tlog_state().size:
                raise LogError(f"leaf {index} is not in a stored tree of size {size}")
            ranges = inclusion_ranges(index, size)
            return hash_ranges(ranges, _nodes(snap.tlog_nodes(nodes_for(ranges))))

    def job_proof(self, job_id: str) -> TlogProof:
        """The job's ``c2sp.org/tlog-proof@v1``: its leaf (in ``extra``), index, inclusion
        proof, and the newest checkpoint that witnesses cosigned (else the latest), with its
        cosignatures.

        Raises:
            NotInLog: the job has no leaf in the log yet.
        """
        with self.store.snapshot() as snap:
            leaf = snap.tlog_leaf_of(job_id)
            if leaf is None:
                queued = snap.tlog_queued_for(job_id)
                raise NotInLog(
                    f"job {job_id} is queued for the log, not integrated yet"
                    if queued
                    else f"job {job_id} has no leaf in the log"
                )
            cosigned = snap.tlog_cosigned_sizes(leaf.index + 1)
            found = snap.tlog_checkpoint(cosigned[0] if cosigned else None)
            if found is None or found[0] <= leaf.index:
                raise LogError(f"no checkpoint covers leaf {leaf.index} yet")
            size, note = found
            ranges = inclusion_ranges(leaf.index, size)
            proof = hash_ranges(ranges, _nodes(snap.tlog_nodes(nodes_for(ranges))))
            note = _with_cosignatures(note, snap.tlog_cosignatures(size))
        return TlogProof(leaf.index, tuple(proof), note, extra=leaf.leaf)

    def tile(self, path: TilePath) -> bytes:
        """A hash tile (concatenated 32-byte hashes) or an entry bundle (uint16-length-prefixed
        leaves), as tlog-tiles serves them.

        Raises:
            NotFound: the tile does not exist (yet) at that width.
        """
        width = path.width or TILE_WIDTH
        start = path.index * TILE_WIDTH
        with self.store.snapshot() as snap:
            if path.level is None:
                leaves = snap.tlog_leaves(start, start + width)
                if len(leaves) != width:
                    raise NotFound(f"no entry bundle {tile_path(None, path.index, path.width)}")
                return b"".join(len(x.leaf).to_bytes(2, "big") + x.leaf for x in leaves)
            hashes = snap.tlog_node_range(8 * path.level, start, width)
            if len(hashes) != width:
                raise NotFound(f"no tile {tile_path(path.level, path.index, path.width)}")
            return b"".join(hashes)

    def add_cosignature(self, note_text: str, witness_vkey: str) -> bool:
        """Store a witness's cosignature of one of this log's checkpoints (the cosigned note as
        the witness returns it); ``False`` if that witness already cosigned that checkpoint.

        Raises:
            NoteError: the key is not a cosigner key, the note is not a stored checkpoint of
                this log, or the cosignature does not verify.
        """
        witness = parse_vkey(witness_vkey)
        if witness.sig_type != COSIGNATURE_V1:
            raise NoteError(f"{witness.name!r} is not a cosigner key (type 0x04)")
        note, _ = open_note(note_text, [witness])
        checkpoint = Checkpoint.from_text(note.text)
        with self.store.snapshot() as snap:
            stored = snap.tlog_checkpoint(checkpoint.size)
            existing = snap.tlog_cosignatures(checkpoint.size)
        if stored is None or parse_note(stored[1]).text != note.text:
            raise NoteError(f"the note is not this log's checkpoint at size {checkpoint.size}")
        sig = next(s for s in note.signatures if witness.matches(s))
        if len(existing) >= MAX_COSIGNATURES:
            raise NoteError(
                f"the checkpoint at size {checkpoint.size} has {MAX_COSIGNATURES} cosignatures"
            )
        with self.store.transaction(durable=True) as tx:
            return tx.tlog_add_cosignature(
                checkpoint.size, sig.name, sig.key_id.hex(), sig.line(), utc_now()
            )


def _nodes(found: Mapping[Node, bytes]) -> Mapping[Node, bytes]:
    return found


def _with_cosignatures(note: str, lines: list[str]) -> str:
    return note + "".join(lines)
