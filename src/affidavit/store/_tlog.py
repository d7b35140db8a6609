"""Statements of the transparency log of seals (tables of migration 10).

:class:`TlogReads` is mixed into transactions and snapshots, :class:`TlogWrites` into
transactions: a seal's leaf is queued by the transaction that writes the seal, and the
sequencer integrates a batch of queued leaves in one transaction fenced by its lease. Tree
hashes are stored as perfect nodes, keyed ``(level << 48) | index`` (see
:mod:`affidavit.core.merkle`). SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.core.merkle import Node

TLOG_MIGRATION = 10  # the log's tables
_INDEX_BITS = 48
_CHUNK = 400  # rows per multi-row INSERT (at most 5 parameters each)


def node_key(node: Node) -> int:
    level, index = node
    return (level << _INDEX_BITS) | index


def key_node(key: int) -> Node:
    return key >> _INDEX_BITS, key & ((1 << _INDEX_BITS) - 1)


@dataclass(frozen=True, slots=True)
class TlogState:
    """The log's head as the store holds it, and the sequencer's lease."""

    origin: str | None
    size: int
    lease_owner: str | None
    lease_until: float | None


@dataclass(frozen=True, slots=True)
class QueuedLeaf:
    seq: int
    job_id: str
    leaf: bytes
    queued_at: float


@dataclass(frozen=True, slots=True)
class LogLeaf:
    index: int
    job_id: str
    leaf: bytes
    queued_at: float
    integrated_at: float


@dataclass(frozen=True, slots=True)
class RejectedLeaf:
    """A queued leaf the sequencer refused (migration 13): ``reason`` is ``duplicate`` (the log
    already holds a leaf for its job id, at ``first_index``) or ``malformed`` (its job id
    field is missing or is not the queue row's, or it is too large for an entry bundle)."""

    seq: int
    job_id: str
    leaf: bytes
    queued_at: float
    rejected_at: float
    reason: str
    first_index: int | None

    def to_dict(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "job_id": self.job_id,
            "reason": self.reason,
            "first_index": self.first_index,
            "queued_at": self.queued_at,
            "rejected_at": self.rejected_at,
            "leaf": self.leaf.decode("utf-8", "replace"),
        }


def _bytes(value: Any) -> bytes:
    return bytes(value) if value is not None else b""


class TlogReads:
    """Reads of the log (a transaction's or a snapshot's)."""

    # False on a copy read as it is from before migration 10 (no log tables: no leaves)
    tlog_tables = True

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def tlog_state(self) -> TlogState:
        row = self.query(
            "SELECT origin, size, lease_owner, lease_until FROM tlog_state WHERE id = 1"
        )[0]
        return TlogState(row[0], int(row[1]), row[2], row[3])

    def tlog_nodes(self, nodes: Iterable[Node]) -> dict[Node, bytes]:
        """The stored hashes of ``nodes`` (missing ones are absent)."""
        keys = sorted({node_key(n) for n in nodes})
        out: dict[Node, bytes] = {}
        for i in range(0, len(keys), _CHUNK):
            part = keys[i : i + _CHUNK]
            marks = ", ".join("?" * len(part))
            for key, value in self.query(
                f"SELECT id, hash FROM tlog_nodes WHERE id IN ({marks})", part
            ):
                out[key_node(int(key))] = _bytes(value)
        return out

    def tlog_node_range(self, level: int, start: int, count: int) -> list[bytes]:
        """The hashes of nodes ``start .. start + count - 1`` at ``level`` (a tile), in order;
        stops at the first missing one."""
        rows = self.query(
            "SELECT id, hash FROM tlog_nodes WHERE id >= ? AND id < ? ORDER BY id",
            (node_key((level, start)), node_key((level, start + count))),
        )
        out: list[bytes] = []
        for key, value in rows:
            if key_node(int(key))[1] != start + len(out):
                break
            out.append(_bytes(value))
        return out

    def tlog_leaf_of(self, job_id: str) -> LogLeaf | None:
        """The job's first leaf in the tree, the one that counts (``None`` if none is
        integrated yet)."""
        found = self.tlog_leaves_of(job_id, 1)
        return found[0] if found else None

    def tlog_leaves_of(self, job_id: str, limit: int) -> list[LogLeaf]:
        """The job's first ``limit`` leaves in the tree, in index order (more than one only in a
        database whose constraint was dropped: see migration 13)."""
        if not self.tlog_tables:
            return []
        rows = self.query(
            "SELECT idx, job_id, leaf, queued_at, integrated_at FROM tlog_leaves "
            # (idx + 0: the job_id index finds its few rows; ordering by the bare key could
            # walk the whole primary key instead, as PostgreSQL's planner may choose)
            "WHERE job_id = ? ORDER BY idx + 0 LIMIT ?",
            (job_id, limit),
        )
        return [_leaf(r) for r in rows]

    def tlog_first_indices(self, job_ids: Iterable[str]) -> dict[str, int]:
        """The index of the first leaf of each of ``job_ids`` that the tree holds."""
        ids = sorted(set(job_ids))
        out: dict[str, int] = {}
        for i in range(0, len(ids), _CHUNK):
            part = ids[i : i + _CHUNK]
            marks = ", ".join("?" * len(part))
            for job_id, idx in self.query(
                f"SELECT job_id, min(idx) FROM tlog_leaves WHERE job_id IN ({marks}) "
                "GROUP BY job_id",
                part,
            ):
                out[str(job_id)] = int(idx)
        return out

    def tlog_rejected(self, limit: int) -> list[RejectedLeaf]:
        """The leaves the sequencer refused, newest first (at most ``limit``)."""
        rows = self.query(
            "SELECT seq, job_id, leaf, queued_at, rejected_at, reason, first_index "
            "FROM tlog_rejected ORDER BY seq DESC LIMIT ?",
            (limit,),
        )
        return [
            RejectedLeaf(
                int(r[0]),
                str(r[1]),
                _bytes(r[2]),
                float(r[3]),
                float(r[4]),
                str(r[5]),
                None if r[6] is None else int(r[6]),
            )
            for r in rows
        ]

    def tlog_leaves(self, start: int, end: int) -> list[LogLeaf]:
        rows = self.query(
            "SELECT idx, job_id, leaf, queued_at, integrated_at FROM tlog_leaves "
            "WHERE idx >= ? AND idx < ? ORDER BY idx",
            (start, end),
        )
        return [_leaf(r) for r in rows]

    def tlog_queued_for(self, job_id: str) -> bool:
        return bool(self.query("SELECT 1 FROM tlog_queue WHERE job_id = ? LIMIT 1", (job_id,)))

    def tlog_queue_length(self) -> int:
        return int(self.query("SELECT count(*) FROM tlog_queue")[0][0])

    def tlog_checkpoint(self, size: int | None = None) -> tuple[int, str] | None:
        """``(size, note)`` of the checkpoint at ``size`` (the latest when ``None``)."""
        if size is None:
            rows = self.query("SELECT size, note FROM tlog_checkpoints ORDER BY size DESC LIMIT 1")
        else:
            rows = self.query("SELECT size, note FROM tlog_checkpoints WHERE size = ?", (size,))
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    def tlog_cosigned_sizes(self, min_size: int) -> list[int]:
        """Sizes ≥ ``min_size`` whose checkpoints carry cosignatures, newest first."""
        rows = self.query(
            "SELECT DISTINCT size FROM tlog_cosignatures WHERE size >= ? ORDER BY size DESC",
            (min_size,),
        )
        return [int(r[0]) for r in rows]

    def tlog_first_cosigned_sizes(self, min_size: int, limit: int) -> list[int]:
        """The smallest ``limit`` sizes ≥ ``min_size`` whose checkpoints carry cosignatures,
        oldest first."""
        rows = self.query(
            "SELECT DISTINCT size FROM tlog_cosignatures WHERE size >= ? ORDER BY size LIMIT ?",
            (min_size, limit),
        )
        return [int(r[0]) for r in rows]

    def tlog_cosignatures(self, size: int) -> list[str]:
        """The cosignature lines stored for the checkpoint at ``size``."""
        rows = self.query(
            "SELECT line FROM tlog_cosignatures WHERE size = ? ORDER BY name, key_id", (size,)
        )
        return [str(r[0]) for r in rows]


def _leaf(row: Sequence[Any]) -> LogLeaf:
    return LogLeaf(int(row[0]), str(row[1]), _bytes(row[2]), float(row[3]), float(row[4]))


class TlogWrites(TlogReads):
    """Writes of the log; relies on the transaction primitives."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    def tlog_take_lease(self, owner: str, now: float, until: float) -> bool:
        """Take (or renew) the sequencer's lease; ``False`` while another owner holds it."""
        rows = self.query(
            "UPDATE tlog_state SET lease_owner = ?, lease_until = ? WHERE id = 1 AND "
            "(lease_owner IS NULL OR lease_owner = ? OR lease_until IS NULL OR lease_until < ?) "
            "RETURNING id",
            (owner, until, owner, now),
        )
        return bool(rows)

    def tlog_release_lease(self, owner: str) -> None:
        self.execute(
            "UPDATE tlog_state SET lease_owner = NULL, lease_until = NULL "
            "WHERE id = 1 AND lease_owner = ?",
            (owner,),
        )

    def tlog_set_origin(self, origin: str) -> None:
        self.execute("UPDATE tlog_state SET origin = ? WHERE id = 1 AND origin IS NULL", (origin,))

    def tlog_queue_batch(self, limit: int) -> list[QueuedLeaf]:
        rows = self.query(
            "SELECT seq, job_id, leaf, queued_at FROM tlog_queue ORDER BY seq LIMIT ?", (limit,)
        )
        return [QueuedLeaf(int(r[0]), str(r[1]), _bytes(r[2]), float(r[3])) for r in rows]

    def tlog_commit_batch(
        self,
        *,
        owner: str,
        old_size: int,
        batch: Sequence[QueuedLeaf],
        nodes: dict[Node, bytes],
        checkpoint: str,
        now: float,
        created_at: str,
    ) -> bool:
        """Write an integrated batch: its leaves (indices from ``old_size``), the new nodes,
        the checkpoint of the new size; drop the batch from the queue. ``False`` (the caller
        must roll back) when the lease is no longer ``owner``'s or the tree moved."""
        new_size = old_size + len(batch)
        moved = self.query(
            "UPDATE tlog_state SET size = ? WHERE id = 1 AND size = ? AND lease_owner = ? "
            "RETURNING id",
            (new_size, old_size, owner),
        )
        if not moved:
            return False
        leaves = [(old_size + i, q.job_id, q.leaf, q.queued_at, now) for i, q in enumerate(batch)]
        self._insert_rows("tlog_leaves (idx, job_id, leaf, queued_at, integrated_at)", 5, leaves)
        self._insert_rows(
            "tlog_nodes (id, hash)", 2, [(node_key(n), h) for n, h in sorted(nodes.items())]
        )
        seqs = [q.seq for q in batch]
        for i in range(0, len(seqs), _CHUNK):
            part = seqs[i : i + _CHUNK]
            self.execute(
                f"DELETE FROM tlog_queue WHERE seq IN ({', '.join('?' * len(part))})", part
            )
        self.execute(
            "INSERT INTO tlog_checkpoints (size, note, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            (new_size, checkpoint, created_at),
        )
        return True

    def tlog_reject(
        self, rejected: Sequence[tuple[QueuedLeaf, str, int | None]], now: float
    ) -> None:
        """Move queued leaves the sequencer refuses (each with its reason and the index of its
        job's logged leaf) from the queue to ``tlog_rejected``."""
        for q, reason, first in rejected:
            self.execute(
                "INSERT INTO tlog_rejected (seq, job_id, leaf, queued_at, rejected_at, reason, "
                "first_index) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (q.seq, q.job_id, q.leaf, q.queued_at, now, reason, first),
            )
            self.execute("DELETE FROM tlog_queue WHERE seq = ?", (q.seq,))

    def tlog_store_checkpoint(self, size: int, note: str, created_at: str) -> None:
        self.execute(
            "INSERT INTO tlog_checkpoints (size, note, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            (size, note, created_at),
        )

    def tlog_add_cosignature(
        self, size: int, name: str, key_id: str, line: str, added_at: str
    ) -> bool:
        """Store a witness's cosignature line for the checkpoint at ``size``; ``False`` when
        that witness key already cosigned it."""
        rows = self.query(
            "INSERT INTO tlog_cosignatures (size, name, key_id, line, added_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING size",
            (size, name, key_id, line, added_at),
        )
        return bool(rows)

    def _insert_rows(self, target: str, width: int, rows: Sequence[Sequence[Any]]) -> None:
        group = "(" + ", ".join("?" * width) + ")"
        for i in range(0, len(rows), _CHUNK):
            part = rows[i : i + _CHUNK]
            params = [v for row in part for v in row]
            self.execute(f"INSERT INTO {target} VALUES {', '.join([group] * len(part))}", params)
