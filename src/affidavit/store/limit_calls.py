"""The events that record limited calls across jobs, for ``affidavit verify --limit``
(:mod:`affidavit.verify.tool_limits`): every job's tool starts and ends and pure steps' ends
(the events a ``limit_grant`` is recorded on, and the ends that close a tool call)."""

from __future__ import annotations

from collections.abc import Iterator

from affidavit.store.base import Store

_TYPES = ("tool_invocation_started", "tool_invocation_finished", "node_finished")
_GRANT_MARK = b'"limit_grant"'


def limited_call_events(
    store: Store, updated_since: str, *, batch: int = 200
) -> Iterator[tuple[str, str, bytes]]:
    """``(job_id, type, payload bytes)`` of the events of every job last updated at or after
    ``updated_since`` (RFC 3339 UTC, the jobs table's text) that carry a grant or may close a
    limited tool call, in each job's log order, job by job. A job's last update comes after
    every event of its log, so no job with an event from then on is missed."""
    with store.transaction(durable=False) as tx:
        job_ids = [
            r[0]
            for r in tx.query(
                "SELECT job_id FROM jobs WHERE updated_at >= ? ORDER BY job_id", (updated_since,)
            )
        ]
    marks = ", ".join("?" for _ in _TYPES)
    for start in range(0, len(job_ids), batch):
        chunk = job_ids[start : start + batch]
        with store.transaction(durable=False) as tx:
            rows = tx.query(
                "SELECT job_id, type, payload FROM events WHERE job_id IN "
                f"({', '.join('?' for _ in chunk)}) AND type IN ({marks}) "
                "ORDER BY job_id, version",
                (*chunk, *_TYPES),
            )
        for job_id, kind, payload in rows:
            data = bytes(payload)
            if kind == "tool_invocation_finished" or _GRANT_MARK in data:
                yield job_id, kind, data
