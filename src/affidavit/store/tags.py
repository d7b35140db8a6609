"""Job tags (table ``job_tags``, migration 25): written in the transaction that creates the job,
read by job id, and matched by ``JobFilter.tags`` (see ``jobs_where``) through the index on
``(key, value, job_id)``. Values are checked before they get here
(:func:`affidavit.core.tags.check_tags`). SQL uses ``?`` placeholders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from affidavit.core.tags import check_tag_filter, parse_tag
from affidavit.store._types import unmatchable

if TYPE_CHECKING:
    from affidavit.store.base import Store

RETENTION_MIGRATION = 25  # job_tags, archived_jobs, retention_policy, retention_holds
# job ids read per statement (well under both backends' limits on parameters)
_BATCH = 500


class Rows(Protocol):
    """What reads need: a transaction, or a snapshot of either backend."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...


class Writes(Rows, Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...


def tag_job(tx: Writes, job_id: str, tags: Mapping[str, str]) -> None:
    """Write ``job_id``'s tags (inside the transaction that creates the job)."""
    for key, value in tags.items():
        tx.execute(
            "INSERT INTO job_tags (job_id, key, value) VALUES (?, ?, ?)", (job_id, key, value)
        )


def tags_of(rows: Rows, job_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """The tags of each of ``job_ids`` (a job without tags is left out), keys sorted. On a
    copy read as it is from before migration 25 (``retention_tables`` false) no job has any."""
    if not getattr(rows, "retention_tables", True):
        return {}
    found: dict[str, dict[str, str]] = {}
    wanted = [j for j in dict.fromkeys(job_ids) if not unmatchable(j)]
    for start in range(0, len(wanted), _BATCH):
        part = wanted[start : start + _BATCH]
        marks = ", ".join("?" for _ in part)
        for job_id, key, value in rows.query(
            f"SELECT job_id, key, value FROM job_tags WHERE job_id IN ({marks}) "
            "ORDER BY job_id, key",
            tuple(part),
        ):
            found.setdefault(str(job_id), {})[str(key)] = str(value)
    return found


def read_tags(store: Store, job_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """:func:`tags_of`, read in a snapshot of ``store`` (no write lock; a read-only store
    reads them too)."""
    if not job_ids:
        return {}
    with store.snapshot() as snap:
        return tags_of(cast(Rows, snap), job_ids)


def with_tags(store: Store, doc: dict[str, Any]) -> dict[str, Any]:
    """A job's document (``JobRecord.to_dict``) with its ``tags`` when it has any."""
    found = read_tags(store, [doc["job_id"]]).get(doc["job_id"])
    return doc if not found else doc | {"tags": found}


def tag_filter(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """Repeated ``KEY=VALUE`` filters (``jobs list --tag``, ``?tag=``) as
    :attr:`JobFilter.tags <affidavit.store.JobFilter>` pairs.

    Raises:
        InvalidTags: a malformed or out-of-bounds one, or more than 16.
    """
    return check_tag_filter(parse_tag(text) for text in texts)
