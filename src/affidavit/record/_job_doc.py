"""What ``jobs show`` and ``GET /api/jobs/{id}`` add to a job's row, each read from the record
without replaying the log: the job's family (its parent and children), the fork it came from
and its seal. Imports nothing but the store, so that showing a job loads neither the engine nor
Verification Mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from affidavit.core.errors import JobNotFound
from affidavit.store import JobFilter, Store, StoredEvent, unmatchable

#: The most children ``jobs show`` lists (``jobs list --parent`` pages through all).
MAX_LISTED_CHILDREN = 1000


def family_doc(store: Store, job_id: str) -> dict[str, Any]:
    """``parent_job_id`` (``None`` for a job no job created) and ``children`` (the ids of the
    job's child jobs, oldest first, at most :data:`MAX_LISTED_CHILDREN`) of ``job_id``, as
    ``jobs show`` and ``GET /api/jobs/{id}`` carry them."""
    listed = store.list_jobs(JobFilter(parent=job_id, limit=MAX_LISTED_CHILDREN))
    return {
        "parent_job_id": store.job_parent(job_id),
        "children": [j.job_id for j in reversed(listed)],
    }


def fork_lineage(events: Sequence[StoredEvent]) -> dict[str, Any] | None:
    """A fork's source as ``jobs show`` and the trace name it: ``{"job_id", "step",
    "seal_hash"}`` of ``job_created``'s ``forked_from``; ``None`` for a job that is no fork."""
    first = events[0].payload if events and events[0].type == "job_created" else None
    forked = first.get("forked_from") if isinstance(first, dict) else None
    if not isinstance(forked, dict):
        return None
    return {k: forked.get(k) for k in ("job_id", "step", "seal_hash")}


def seal_document(store: Store, job_id: str) -> dict[str, Any]:
    """The job's seal as an offline verifier takes it (``verify_events(..., seal=...)``):
    ``{"seal": Seal.to_dict() or None, "error": None}``; a seal row that cannot be read (it was
    edited) gives ``{"seal": None, "error": why}``. The job must exist.

    Raises:
        JobNotFound: no such job (also an id no job can have: not Unicode text, or with a NUL).
    """
    if unmatchable(job_id):
        raise JobNotFound(job_id)
    with store.snapshot() as snap:
        if snap.job_row(job_id) is None:
            raise JobNotFound(job_id)
        try:
            seal = snap.seal_get(job_id)
        except ValueError as exc:
            return {"seal": None, "error": f"the seal row is malformed: {exc}"}
    return {"seal": seal.to_dict() if seal is not None else None, "error": None}
