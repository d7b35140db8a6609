"""Child jobs (table ``job_children``, migration 23): which job created which, and which
children a waiting parent awaits.

The transaction that ends a child (any terminal status, whoever writes it) makes its parent
runnable again when the parent waits, awaits that child and no other awaited child still runs
(see :meth:`ChildOps.wake_parent`). Both it and the parent's wait
transaction write the child's row here first — the child's end its ``ended_at``, the parent's
wait its ``awaited`` (and only then reads the children's statuses and changes its own status) —
so the two are serialized on that row: either the parent's wait reads the child ended and does
not wait, or the child's end sees the parent waiting and awaiting it, and wakes it. The
wake-up cannot be lost; taking this row before any job row keeps the lock order one way (no
deadlock), and the child's two statements are writes a backend may send with the commit (no
round trip of their own).

Mixed into :class:`~affidavit.store._sql.SqlTransaction`. SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

from affidavit.core.events import utc_now

_PARENT_OF = "SELECT parent_job_id FROM job_children WHERE child_job_id = ?"


class ChildOps:
    """The child-job statements of a transaction."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def link_child(self, child_job_id: str, parent_job_id: str, parent_step_id: str) -> None:
        """Record that ``parent_job_id``'s step ``parent_step_id`` created ``child_job_id``
        (in the transaction that creates the child)."""
        self.execute(
            "INSERT INTO job_children (child_job_id, parent_job_id, parent_step_id, created_at) "
            "VALUES (?, ?, ?, ?)",
            (child_job_id, parent_job_id, parent_step_id, utc_now()),
        )

    def await_children(self, parent_job_id: str, child_job_ids: Sequence[str]) -> dict[str, str]:
        """Mark ``child_job_ids`` awaited by ``parent_job_id`` and return each one's status
        now — before the transaction writes the parent's row (see the module docstring)."""
        if not child_job_ids:
            return {}
        marks = ", ".join("?" for _ in child_job_ids)
        self.execute(
            f"UPDATE job_children SET awaited = 1 WHERE parent_job_id = ? "
            f"AND child_job_id IN ({marks})",
            (parent_job_id, *child_job_ids),
        )
        rows = self.query(
            f"SELECT job_id, status FROM jobs WHERE job_id IN ({marks})", tuple(child_job_ids)
        )
        return {str(r[0]): str(r[1]) for r in rows}

    FOR_UPDATE: str  # the backend's row-lock clause (empty on SQLite: its writers take turns)

    def wake_parent(self, child_job_id: str) -> None:
        """The child ``child_job_id`` ended: if its parent waits for it and for no child still
        running, the parent is ``pending`` again (see the module docstring). Writes only, no
        read to wait for.

        The parent is woken once, by its last awaited child to end, not by each (every wake-up
        is a claim and a replay of the parent's log). Two children ending at once take turns
        on the waiting parent's row (locked by a statement of its own, as the wake-up's update
        locked it before: only while the parent waits), and the wake-up's statement, begun
        after that lock, sees what the other committed: the second to end sees the first ended,
        so one of them always wakes the parent. A parent not waiting yet reads its children's
        statuses after their rows here (``await_children``), as before."""
        now = utc_now()
        self.execute(
            "UPDATE job_children SET ended_at = ? WHERE child_job_id = ?", (now, child_job_id)
        )
        if self.FOR_UPDATE:
            self.execute(
                "SELECT 1 FROM jobs WHERE status = 'waiting' AND job_id = (SELECT "
                f"parent_job_id FROM job_children WHERE child_job_id = ? AND awaited = 1)"
                f"{self.FOR_UPDATE}",
                (child_job_id,),
            )
        self.execute(
            "UPDATE jobs SET status = 'pending', updated_at = ? WHERE status = 'waiting' "
            "AND job_id = (SELECT parent_job_id FROM job_children WHERE child_job_id = ? "
            "AND awaited = 1) AND NOT EXISTS (SELECT 1 FROM job_children o "
            "WHERE o.parent_job_id = jobs.job_id AND o.awaited = 1 AND o.ended_at IS NULL)",
            (now, child_job_id),
        )


class ChildTransaction(Protocol):
    """Child jobs (see affidavit.store._children), in a write transaction."""

    def link_child(self, child_job_id: str, parent_job_id: str, parent_step_id: str) -> None:
        """Record that ``parent_job_id``'s step ``parent_step_id`` created ``child_job_id``."""
        ...

    def await_children(self, parent_job_id: str, child_job_ids: Sequence[str]) -> dict[str, str]:
        """Mark the children awaited by the (locked, waiting) parent; their statuses now."""
        ...


def parent_sql() -> str:
    """The query for a job's parent (one row, or none)."""
    return _PARENT_OF
