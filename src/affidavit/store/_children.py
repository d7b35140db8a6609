"""Child jobs (table ``job_children``, migration 23): which job created which, and which
children a waiting parent awaits.

The transaction that ends a child (any terminal status, whoever writes it) makes its parent
runnable again when the parent waits and awaits that child. Both it and the parent's wait
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

    def wake_parent(self, child_job_id: str) -> None:
        """The child ``child_job_id`` ended: if its parent waits for it, the parent is
        ``pending`` again (see the module docstring). Two writes, no read."""
        now = utc_now()
        self.execute(
            "UPDATE job_children SET ended_at = ? WHERE child_job_id = ?", (now, child_job_id)
        )
        self.execute(
            "UPDATE jobs SET status = 'pending', updated_at = ? WHERE status = 'waiting' "
            "AND job_id = (SELECT parent_job_id FROM job_children WHERE child_job_id = ? "
            "AND awaited = 1)",
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
