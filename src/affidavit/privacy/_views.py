"""What the faces show of a subject: one document for ``affidavit subjects list | show`` and
``GET /api/subjects[/{subject}]``, never the subject itself nor any of its jobs' values."""

from __future__ import annotations

from typing import Any

from affidavit.privacy._erase import find_subject
from affidavit.store import Store, SubjectRow


def subject_document(row: SubjectRow, job_ids: list[str] | None = None) -> dict[str, Any]:
    """``row`` as the faces show it: its id (the keyed hash), data key id, creation, jobs
    count, first and last use, erasure; with ``job_ids``, those too."""
    doc: dict[str, Any] = {
        "subject_id": row.subject_id,
        "key_id": row.key_id,
        "created_at": row.created_at,
        "jobs": row.jobs,
        "first_used": row.first_used,
        "last_used": row.last_used,
        "erased_at": row.erased_at,
        "erase_reason": row.erase_reason,
    }
    if job_ids is not None:
        doc["job_ids"] = job_ids
    return doc


def list_subjects(
    store: Store, *, after: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The subjects of ``store``, oldest first (no master key needed: ids only); ``after``:
    those after the subject of that id; ``limit``: at most that many."""
    return [subject_document(r) for r in store.list_subjects(after=after, limit=limit)]


def show_subject(store: Store, subject: str) -> dict[str, Any]:
    """``subject``'s document with its job ids.

    Raises:
        SubjectError: a malformed subject.
        SubjectNotFound: no job was ever submitted for it.
        MasterKeyError: no master key is configured.
    """
    row = find_subject(store, subject)
    return subject_document(row, store.subject_job_ids(row.subject_id))
