"""The leaves of a checkpointed tree, read from where the log publishes them and checked against
the checkpoint: what shows that a leaf is the first of its record (job id) in that tree.

An inclusion proof shows that a leaf is at index ``i`` of the tree a checkpoint signs; it says
nothing about the other leaves. To show that no earlier leaf has the same record id, a verifier
reads the ``i`` leaves before it — as tlog-tiles entry bundles over HTTP (``--log-url``), or
from the store — computes the root of the tree of size ``i`` over them, and checks the log's
consistency proof from size ``i`` to the checkpoint's size against the checkpoint's root. The
leaves are then exactly the first ``i`` of the checkpointed tree, whoever served them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from affidavit.core.checkpoint import Checkpoint
from affidavit.core.errors import VerificationError
from affidavit.core.merkle import root_of, verify_consistency
from affidavit.tlog._leaves import record_id

if TYPE_CHECKING:
    from affidavit.store import Store

TILE_WIDTH = 256
MAX_PREFIX_LEAVES = 1 << 20  # leaves read before one leaf (~4,096 entry bundles)
MAX_BUNDLE_BYTES = 4 << 20  # one entry bundle's response
MAX_CONSISTENCY_BYTES = 64 << 10
MAX_READ_SECONDS = 600.0  # every request of one verification together


class EntriesError(VerificationError):
    """The leaves before a leaf could not be read, or do not match the checkpoint."""

    code = "log_entries"
    default_hint = "Check --log-url (the log's base URL, as witnesses use it)."


class EntrySource(Protocol):
    """Where a verifier reads a log's leaves and consistency proofs."""

    def bundle(self, index: int, width: int) -> bytes:
        """Entry bundle ``index`` with its first ``width`` leaves (tlog-tiles encoding)."""
        ...

    def consistency(self, old_size: int, new_size: int) -> list[bytes]: ...


def parse_bundle(data: bytes, width: int) -> list[bytes]:
    """The ``width`` leaves of an entry bundle (uint16 big-endian length, then the leaf).

    Raises:
        EntriesError: not exactly ``width`` such leaves.
    """
    leaves: list[bytes] = []
    at = 0
    while at < len(data) and len(leaves) < width:
        if at + 2 > len(data):
            break
        n = int.from_bytes(data[at : at + 2], "big")
        if at + 2 + n > len(data):
            break
        leaves.append(data[at + 2 : at + 2 + n])
        at += 2 + n
    if len(leaves) != width or at != len(data):
        raise EntriesError(f"an entry bundle does not hold exactly {width} leaves")
    return leaves


def leaves_before(source: EntrySource, index: int, size: int) -> Iterator[bytes]:
    """The leaves ``0 .. index - 1`` of the tree of ``size`` leaves, bundle by bundle (each
    bundle as wide as it is at that size: full ones whole, as tlog-tiles serves them).

    Raises:
        EntriesError: a bundle cannot be read or is malformed, or ``index`` is too large.
    """
    if index > MAX_PREFIX_LEAVES:
        raise EntriesError(
            f"leaf {index} has more than {MAX_PREFIX_LEAVES} leaves before it: too many to read",
            hint="Rely on witnesses that audit every new entry for a repeated job id.",
        )
    for n in range(0, index, TILE_WIDTH):
        width = min(TILE_WIDTH, size - n)
        leaves = parse_bundle(source.bundle(n // TILE_WIDTH, width), width)
        yield from leaves[: index - n]


@dataclass(frozen=True, slots=True)
class Earlier:
    """The verdict of :func:`first_of_record`: ``index`` of an earlier leaf with the same
    record id (``None``: there is none), and how many leaves were read."""

    index: int | None
    read: int


def first_of_record(source: EntrySource, checkpoint: Checkpoint, index: int, rid: str) -> Earlier:
    """Read the leaves before leaf ``index`` of the tree ``checkpoint`` signs, check that they
    are that tree's (their root, and the consistency proof to the checkpoint's root), and find
    the first whose record id is ``rid``.

    Raises:
        EntriesError: the leaves cannot be read, or they are not the checkpointed tree's.
    """
    if not 0 <= index < checkpoint.size:
        raise EntriesError(f"leaf {index} is not in the tree of size {checkpoint.size}")
    if index == 0:
        return Earlier(None, 0)
    prefix = list(leaves_before(source, index, checkpoint.size))
    try:
        verify_consistency(
            index, checkpoint.size, source.consistency(index, checkpoint.size),
            root_of(prefix), checkpoint.root,
        )  # fmt: skip
    except VerificationError as exc:
        raise EntriesError(
            f"the {index} leaves before leaf {index} are not those of the checkpointed tree: "
            f"{exc.message}"
        ) from None
    for at, leaf in enumerate(prefix):
        if record_id(leaf) == rid:
            return Earlier(at, index)
    return Earlier(None, index)


def decode_proof(hashes: object) -> list[bytes]:
    """A consistency proof as the log's JSON carries it (base64 hashes).

    Raises:
        EntriesError: not a list of base64 strings.
    """
    if not isinstance(hashes, list) or len(hashes) > 128:
        raise EntriesError("the consistency proof is not a list of at most 128 hashes")
    out: list[bytes] = []
    for h in hashes:
        if not isinstance(h, str):
            raise EntriesError("a consistency proof hash is not a string")
        try:
            out.append(base64.b64decode(h.encode("ascii"), validate=True))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise EntriesError("a consistency proof hash is not base64") from None
    return out


class StoreEntries:
    """The leaves and proofs of the log a store holds (a verifier with database access)."""

    def __init__(self, store: Store) -> None:
        from affidavit.tlog._log import TransparencyLog

        self.log = TransparencyLog(store)

    def bundle(self, index: int, width: int) -> bytes:
        from affidavit.core.errors import NotFound
        from affidavit.tlog._log import TilePath

        try:
            return self.log.tile(TilePath(None, index, width if width < TILE_WIDTH else None))
        except NotFound as exc:
            raise EntriesError(f"the store has no entry bundle {index}: {exc.message}") from None

    def consistency(self, old_size: int, new_size: int) -> list[bytes]:
        from affidavit.core.errors import AffidavitError

        try:
            return self.log.consistency(old_size, new_size)
        except AffidavitError as exc:
            raise EntriesError(f"the store has no consistency proof: {exc.message}") from None


class HttpEntries:
    """The leaves and proofs a log serves at ``base_url`` (tlog-tiles entry bundles under
    ``/log/tile/entries/``, consistency proofs at ``/log/consistency``), read through the
    witnesses' :class:`~affidavit.tlog._fetch.LogClient`: each response is bounded in size, each
    read in time, and all of them together by ``total_seconds``."""

    def __init__(
        self, base_url: str, *, timeout: float = 10.0, total_seconds: float = MAX_READ_SECONDS
    ) -> None:
        import time

        from affidavit.tlog._fetch import LogClient

        self.base = base_url.rstrip("/")
        self.client = LogClient(self.base, timeout=timeout, deadline=total_seconds)
        self.deadline = time.monotonic() + total_seconds

    def close(self) -> None:
        self.client.close()

    def _get(self, path: str, limit: int, params: dict[str, int] | None = None) -> bytes:
        import time

        from affidavit.tlog._fetch import AnswerTooBig, LogReadError

        left = self.deadline - time.monotonic()
        if left <= 0:
            raise EntriesError(f"reading the log at {self.base} took too long")
        self.client.deadline = left  # (what is left of the whole read, for this response)
        try:
            return self.client.get(path, cap=limit, **(params or {}))
        except AnswerTooBig:
            raise EntriesError(f"GET {self.base}{path}: more than {limit} bytes") from None
        except LogReadError as exc:
            raise EntriesError(exc.message) from None

    def bundle(self, index: int, width: int) -> bytes:
        from affidavit.tlog._log import tile_path

        path = tile_path(None, index, width if width < TILE_WIDTH else None)
        return self._get(f"/log/tile/{path}", MAX_BUNDLE_BYTES)

    def consistency(self, old_size: int, new_size: int) -> list[bytes]:
        import json

        body = self._get(
            "/log/consistency", MAX_CONSISTENCY_BYTES, {"old": old_size, "new": new_size}
        )
        try:
            value = json.loads(body)
        except ValueError:
            raise EntriesError("the consistency proof is not JSON") from None
        return decode_proof(value.get("proof") if isinstance(value, dict) else None)
