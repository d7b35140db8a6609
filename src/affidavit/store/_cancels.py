"""Cancel requests (table ``cancel_requests``, migration 17): a person asked to cancel a job
whose tool call was in flight. The request is recorded and the call left to finish; from then
on the store itself refuses to start anything new in the job (see the migration's triggers),
so the run that holds it ends the job as cancelled at its next step boundary.

Mixed into :class:`~affidavit.store._sql.SqlTransaction`. SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from affidavit.store.base import CancelRequest

# (the refusal a trigger raises on SQLite; PostgreSQL's is SQLSTATE AFJ05)
CANCEL_REFUSAL = "affidavit_cancel_requested"


class CancelOps:
    """The cancel-request statements of a transaction."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def cancel_request(self, job_id: str) -> CancelRequest | None:
        """The cancel request in force for ``job_id``, if one was recorded."""
        rows = self.query(
            "SELECT job_id, requested_at, reason, requested_by FROM cancel_requests "
            "WHERE job_id = ?",
            (job_id,),
        )
        return CancelRequest(*rows[0]) if rows else None

    def request_cancel(
        self, job_id: str, *, at: str, reason: str | None, by: str | None
    ) -> CancelRequest:
        """Record a cancel request for ``job_id`` (the job's row locked by the caller); the
        first request stays in force, and is returned, when there is one already."""
        found = self.cancel_request(job_id)
        if found is not None:
            return found
        self.execute(
            "INSERT INTO cancel_requests (job_id, requested_at, reason, requested_by) "
            "VALUES (?, ?, ?, ?)",
            (job_id, at, reason, by),
        )
        return CancelRequest(job_id, at, reason, by)
