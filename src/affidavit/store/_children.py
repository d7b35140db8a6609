"""Child jobs (table ``job_children``, migration 23): which job created which, and which
children a waiting parent awaits.

The transaction that ends a child (any terminal status, whoever writes it) makes its parent
runnable again when the parent waits and awaits that child: it locks the parent's row first,
so that it and the parent's own wait transaction (which sets ``awaited`` and then reads the
children's statuses) are serialized — either the parent sees the child ended and does not
wait, or the child's end sees the parent waiting and wakes it. The wake-up cannot be lost.

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

    FOR_UPDATE: str

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
        """Mark ``child_job_ids`` awaited by ``parent_job_id`` (whose row the caller has
        locked, by the status change that makes it wait) and return each one's status now."""
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
        ``pending`` again (see the module docstring for why the parent's row is locked first)."""
        rows = self.query(
            "SELECT j.job_id FROM jobs j JOIN job_children c ON j.job_id = c.parent_job_id "
            "WHERE c.child_job_id = ?" + (" FOR UPDATE OF j" if self.FOR_UPDATE else ""),
            (child_job_id,),
        )
        if not rows:
            return
        self.execute(
            "UPDATE jobs SET status = 'pending', updated_at = ? WHERE job_id = ? "
            "AND status = 'waiting' AND EXISTS (SELECT 1 FROM job_children "
            "WHERE child_job_id = ? AND awaited = 1)",
            (utc_now(), rows[0][0], child_job_id),
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
