"""Auditing a log's entries from its tiles: what a witness checks before it cosigns and what
``affidavit log monitor`` checks for auditors.

A checkpoint's signature and its consistency with the last one seen prove the log only
appended; they say nothing about *what* it appended. An operator with every key and the
database can append a second leaf for a job it rewrote, and the tree stays consistent. So
:meth:`Audit.run`, for a checkpoint of size ``n`` and an index covering ``[0, m)``:

1. reads the hashes of the perfect subtrees covering ``[0, m)`` from the hash tiles, and the
   entries ``[m, n)`` from the entry bundles (tlog-tiles), each response capped (_fetch.py);
2. folds them into a root, which must be the checkpoint's signed root — else nothing read is
   trusted (:class:`EntriesMismatch`) and nothing else is concluded;
3. parses each new leaf (:func:`leaf_job_id`) and looks its job id up in the durable index of
   every job id seen before (store/audit_index.py) and earlier in the batch: one leaf per
   ``job_id`` value. A repeat is a ``duplicate_job`` finding, an unparsable leaf a
   ``malformed_leaf`` one; the earlier leaf of a duplicate is read back with an inclusion
   proof against the same root.

The batch of new job ids stays uncommitted: the caller commits it once its own state is
durable, or the audit leaves the index as it was.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from affidavit.core.checkpoint import Checkpoint
from affidavit.core.errors import AffidavitError, VerificationError
from affidavit.core.merkle import (
    Node,
    ProofError,
    fold,
    inclusion_ranges,
    leaf_hash,
    node_hash,
    range_nodes,
    verify_consistency,
    verify_inclusion,
)
from affidavit.core.seal import LOG_LEAF_TYPE
from affidavit.store.audit_index import JobIndex, job_key
from affidavit.tlog._fetch import LogClient, LogReadError, NoProof
from affidavit.tlog._log import TILE_WIDTH
from affidavit.tlog._verify import parse_leaf

MAX_LEAF_BYTES = 8192
MAX_JOB_ID_CHARS = 1024
MAX_FINDINGS = 100  # per audit: the first ones, with their leaves, are evidence enough
_LEAF_TYPE = re.compile(r"affidavit\.[a-z0-9_.-]{1,64}/v[0-9]{1,4}")


class EntriesMismatch(VerificationError):
    """The entries and tiles the log served do not hash to its signed root."""

    code = "entries_mismatch"
    default_hint = (
        "The log serves entries that are not the tree it signed: nothing was cosigned or "
        "recorded. Retry; if it persists, the log (or something in front of it) is lying."
    )


class ForkDetected(VerificationError):
    """The log showed a checkpoint inconsistent with one this auditor cosigned or verified."""

    code = "fork_detected"
    default_hint = (
        "The log's history was rewritten: the witness refuses to cosign. Keep the evidence file "
        "and tell whoever relies on this log."
    )


class AuditInterrupted(AffidavitError):
    """Stopped (a signal) in the middle of an audit; the index is as it was before it."""

    code = "interrupted"
    default_hint = "Run it again: the audit resumes from the last tree verified."


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem with one new entry: ``duplicate_job`` or ``malformed_leaf``."""

    kind: str
    index: int
    reason: str
    leaf: bytes
    job_id: str | None = None
    earlier_index: int | None = None
    earlier_leaf: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "index": self.index,
            "reason": self.reason,
            "job_id": self.job_id,
            "earlier_index": self.earlier_index,
            "leaf": base64.b64encode(self.leaf).decode(),
            "earlier_leaf": (
                None if self.earlier_leaf is None else base64.b64encode(self.earlier_leaf).decode()
            ),
        }


def leaf_job_id(data: bytes) -> str:
    """The ``job_id`` of a log leaf: a JSON object with a ``type`` ``affidavit.<name>/v<N>``
    and a non-empty string ``job_id``; an ``affidavit.seal/v1`` leaf must be exactly one
    (docs/formats.md).

    Raises:
        ValueError: a malformed leaf (the message says how).
    """
    if len(data) > MAX_LEAF_BYTES:
        raise ValueError(f"the leaf is {len(data)} bytes, over {MAX_LEAF_BYTES}")
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = str(exc) if isinstance(exc, _RepeatedKey) else "is not UTF-8 JSON (or nests too deep)"
        raise ValueError(f"the leaf {why}") from None
    if not isinstance(value, dict):
        raise ValueError("the leaf is not a JSON object")
    kind, job_id = value.get("type"), value.get("job_id")
    if not isinstance(kind, str) or not _LEAF_TYPE.fullmatch(kind):
        raise ValueError(f"the leaf's type {str(kind)[:80]!r} is not affidavit.<name>/v<N>")
    if not isinstance(job_id, str) or not 0 < len(job_id) <= MAX_JOB_ID_CHARS:
        raise ValueError("the leaf has no job_id string (1 to 1024 characters)")
    if kind == LOG_LEAF_TYPE:
        try:
            parse_leaf(data)
        except VerificationError as exc:
            raise ValueError(exc.message) from None
    return job_id


class _RepeatedKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: a leaf with two ``job_id`` members names
    two jobs, depending on who reads it."""
    value = dict(pairs)
    if len(value) != len(pairs):
        raise _RepeatedKey("repeats a key in one JSON object")
    return value


Progress = Callable[[int, int], None]


class Audit:
    """One audit of the entries a checkpoint adds to what ``index`` covers."""

    def __init__(
        self,
        client: LogClient,
        index: JobIndex,
        *,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.client = client
        self.index = index
        self.progress = progress
        self.should_stop = should_stop
        self._tiles: dict[tuple[int, int, int], list[bytes]] = {}

    def run(self, checkpoint: Checkpoint) -> list[Finding]:
        """Audit leaves ``[index.size, checkpoint.size)``; the findings (first
        :data:`MAX_FINDINGS`), empty when every new leaf names a new job. With no findings the
        index's batch is left open for :meth:`JobIndex.commit`; otherwise it is dropped.

        Raises:
            EntriesMismatch: what the log served does not hash to the checkpoint's root.
            LogReadError: the log is unreachable or served malformed tiles or bundles.
            AuditInterrupted: ``should_stop`` said so between two bundles.
        """
        self._tiles.clear()
        start, size = self.index.size, checkpoint.size
        if start > size:
            raise ValueError(f"the index covers {start} leaves, the tree has {size}")
        self.index.begin()
        if start == size:  # nothing new (the root is the one the caller verified)
            return []
        try:
            findings = self._scan(start, checkpoint)
            if findings:
                self.index.abort()
                return [self._with_earlier(f, checkpoint) for f in findings]
        except BaseException:
            self.index.abort()
            raise
        return []

    def _scan(self, start: int, checkpoint: Checkpoint) -> list[Finding]:
        size = checkpoint.size
        stack = [(n[0], self._node(n, size)) for n in range_nodes(0, start)] if start else []
        findings: list[Finding] = []
        for bundle in range(start // TILE_WIDTH, -(-size // TILE_WIDTH)):
            if self.should_stop is not None and self.should_stop():
                raise AuditInterrupted("stopped in the middle of an audit; nothing recorded")
            first = bundle * TILE_WIDTH
            entries = self.client.entries(bundle, min(TILE_WIDTH, size - first))
            for offset, leaf in enumerate(entries):
                if first + offset >= start:
                    _push(stack, leaf_hash(leaf))
                    finding = self._check(first + offset, leaf)
                    if finding is not None and len(findings) < MAX_FINDINGS:
                        findings.append(finding)
            if self.progress is not None:
                self.progress(min(size, first + TILE_WIDTH) - start, size - start)
        root = fold([h for _, h in stack]) if stack else None
        if size and root != checkpoint.root:
            raise EntriesMismatch(
                f"the entries {start}..{size - 1} and tiles the log served do not hash to its "
                f"signed root at size {size}: nothing in them is trusted"
            )
        return findings

    def _check(self, index: int, leaf: bytes) -> Finding | None:
        try:
            job_id = leaf_job_id(leaf)
        except ValueError as exc:
            return Finding("malformed_leaf", index, f"leaf {index} is malformed: {exc}", leaf)
        earlier = self.index.add(job_key(job_id), index)
        if earlier is None:
            return None
        reason = f"leaf {index} repeats job {job_id!r} (first logged at leaf {earlier})"
        return Finding("duplicate_job", index, reason, leaf, job_id, earlier)

    def _with_earlier(self, finding: Finding, checkpoint: Checkpoint) -> Finding:
        if finding.earlier_index is None:
            return finding
        leaf = self.verified_leaf(finding.earlier_index, checkpoint)
        return Finding(
            finding.kind,
            finding.index,
            finding.reason,
            finding.leaf,
            finding.job_id,
            finding.earlier_index,
            leaf,
        )

    def verified_leaf(self, index: int, checkpoint: Checkpoint) -> bytes | None:
        """Leaf ``index`` read from its bundle and checked by an inclusion proof (from the
        tiles) against the checkpoint's root; ``None`` if the log does not serve it so."""
        size = checkpoint.size
        bundle = index // TILE_WIDTH
        try:
            leaf = self.client.entries(bundle, min(TILE_WIDTH, size - bundle * TILE_WIDTH))[
                index % TILE_WIDTH
            ]
            proof = [
                fold([self._node(n, size) for n in range_nodes(s, e)])
                for s, e in inclusion_ranges(index, size)
            ]
            verify_inclusion(leaf_hash(leaf), index, size, proof, checkpoint.root)
        except (LogReadError, ProofError):
            return None
        return leaf

    def _node(self, node: Node, size: int) -> bytes:
        """The hash of perfect node ``(level, index)`` of the tree of ``size``, from the hash
        tile at level ``level // 8`` (levels between tiles are hashed up here)."""
        level, i = node
        tier, height = divmod(level, 8)
        first = i << height
        tile, offset = divmod(first, TILE_WIDTH)
        width = min(TILE_WIDTH, (size >> (8 * tier)) - tile * TILE_WIDTH)
        key = (tier, tile, width)
        if key not in self._tiles:
            self._tiles[key] = self.client.tile(tier, tile, width)
        hashes = self._tiles[key][offset : offset + (1 << height)]
        while len(hashes) > 1:
            hashes = [node_hash(hashes[k], hashes[k + 1]) for k in range(0, len(hashes), 2)]
        return hashes[0]


def _push(stack: list[tuple[int, bytes]], h: bytes) -> None:
    """Append a leaf hash to a compact range (perfect subtrees, strictly decreasing levels)."""
    level = 0
    while stack and stack[-1][0] == level:
        _, left = stack.pop()
        h = node_hash(left, h)
        level += 1
    stack.append((level, h))


def inconsistency(client: LogClient, old: Checkpoint, new: Checkpoint) -> str:
    """Why ``new`` does not extend ``old`` (``""`` when it does).

    Raises:
        LogReadError: the log is unreachable.
    """
    if new.size < old.size:
        return f"the tree shrank from {old.size} to {new.size}"
    if new.size == old.size:
        return "" if new.root == old.root else f"two roots for size {new.size}"
    try:
        proof = client.consistency(old.size, new.size)
        verify_consistency(old.size, new.size, proof, old.root, new.root)
    except NoProof:
        return "the log answered no consistency proof"
    except ProofError as exc:
        return f"the consistency proof does not verify ({exc.message})"
    return ""


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` durably: a temporary file, fsync, rename, fsync of the directory."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_evidence(state_dir: Path, kind: str, doc: dict[str, Any]) -> Path:
    """``<kind>-<size>-<ns>.json`` in the state directory (never overwritten)."""
    path = state_dir / f"{kind}-{doc.get('size', 0)}-{time.time_ns()}.json"
    write_atomic(path, json.dumps({"detected_at": int(time.time()), **doc}, indent=2).encode())
    return path


def findings_evidence(checkpoint: Checkpoint, note: str, findings: list[Finding]) -> dict[str, Any]:
    """The evidence of an audit's findings: the signed checkpoint and each finding's leaves."""
    return {
        "reason": findings[0].kind,
        "origin": checkpoint.origin,
        "size": checkpoint.size,
        "checkpoint": note,
        "findings": [f.to_dict() for f in findings],
    }
