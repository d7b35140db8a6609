"""The transparency log's reads and writes of the storage contract (see
:mod:`affidavit.store._tlog`), shared by :class:`~affidavit.store.base.Transaction` and
:class:`~affidavit.store.base.Snapshot`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from affidavit.core.merkle import Node
    from affidavit.store._tlog import LogLeaf, QueuedLeaf, RejectedLeaf, TlogState


class TlogReader(Protocol):
    """Reads of the transparency log of seals (see affidavit.store._tlog)."""

    def tlog_state(self) -> TlogState: ...

    def tlog_nodes(self, nodes: Iterable[Node]) -> dict[Node, bytes]: ...

    def tlog_node_range(self, level: int, start: int, count: int) -> list[bytes]: ...

    def tlog_leaf_of(self, job_id: str) -> LogLeaf | None: ...

    def tlog_leaves_of(self, job_id: str, limit: int) -> list[LogLeaf]: ...

    def tlog_first_indices(self, job_ids: Iterable[str]) -> dict[str, int]: ...

    def tlog_rejected(self, limit: int) -> list[RejectedLeaf]: ...

    def tlog_first_cosigned_sizes(self, min_size: int, limit: int) -> list[int]: ...

    def tlog_leaves(self, start: int, end: int) -> list[LogLeaf]: ...

    def tlog_queued_for(self, job_id: str) -> bool: ...

    def tlog_queue_length(self) -> int: ...

    def tlog_checkpoint(self, size: int | None = None) -> tuple[int, str] | None: ...

    def tlog_cosigned_sizes(self, min_size: int) -> list[int]: ...

    def tlog_cosignatures(self, size: int) -> list[str]: ...


class TlogWriter(TlogReader, Protocol):
    """Writes of the transparency log of seals (see affidavit.store._tlog)."""

    def tlog_take_lease(self, owner: str, now: float, until: float) -> bool: ...

    def tlog_release_lease(self, owner: str) -> None: ...

    def tlog_set_origin(self, origin: str) -> None: ...

    def tlog_queue_batch(self, limit: int) -> list[QueuedLeaf]: ...

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
    ) -> bool: ...

    def tlog_reject(
        self, rejected: Sequence[tuple[QueuedLeaf, str, int | None]], now: float
    ) -> None: ...

    def tlog_store_checkpoint(self, size: int, note: str, created_at: str) -> None: ...

    def tlog_add_cosignature(
        self, size: int, name: str, key_id: str, line: str, added_at: str
    ) -> bool: ...
