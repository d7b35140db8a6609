"""What both backends' SQL reads and writes, as values: events encoded for an append (their
types and ids checked), jobs and events read from rows, the refusals of an append, the chain of
new rows, and the filters of a job listing. No SQL is run here; placeholders are ``?``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.chain import chain_next
from affidavit.core.errors import (
    ConfigError,
    ConflictError,
    FencedError,
    InvalidEventError,
    JobNotFound,
)
from affidavit.core.ids import is_generated_id, new_event_ids
from affidavit.store.base import (
    JOB_STATUSES,
    Encoded,
    JobFilter,
    JobRecord,
    NewEvent,
    StoredEvent,
    checked_event,
    unmatchable,
)

_EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
# event types already found valid (a small vocabulary: checked once each, not once per event)
_VALID_TYPES: set[str] = set()
_VALID_TYPES_KEPT = 1024
_EVENT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}\Z")

MAX_INT64 = 2**63 - 1


def encode_events(events: Sequence[NewEvent]) -> list[Encoded]:
    """Canonicalize every payload once, before any lock is taken.

    Event types and ids are checked here because the chain formula separates them with spaces
    and newlines: a type or id containing one would make two different logs hash alike.
    """
    encoded: list[Encoded] = []
    fresh_ids = iter(new_event_ids(sum(1 for ev in events if ev.event_id is None)))
    valid_types = _VALID_TYPES
    for ev in events:
        event_type = ev.type if type(ev.type) is str else str(ev.type)
        if event_type not in valid_types:
            if not _EVENT_TYPE.match(event_type):
                raise InvalidEventError(
                    f"invalid event type {event_type!r}",
                    hint="Event types are lowercase snake_case (letters, digits, '_').",
                )
            if len(valid_types) < _VALID_TYPES_KEPT:
                valid_types.add(event_type)
        if ev.event_id is None:
            event_id = next(fresh_ids)
        else:
            event_id = ev.event_id
            if not _EVENT_ID.match(event_id):
                raise InvalidEventError(
                    f"invalid event id {event_id!r}",
                    hint="Event ids are 1-128 characters of letters, digits and _ . : -",
                )
            if is_generated_id(event_id):
                raise InvalidEventError(
                    f"event id {event_id!r} has the form of the ids the store makes",
                    hint="Leave event_id out to get a new id, or give one of another form "
                    "(32 lowercase hex digits of a UUIDv7 are reserved; the database keeps "
                    "every other id unique).",
                )
        if not isinstance(ev.payload, Mapping):
            raise InvalidEventError(f"{event_type} payload must be a JSON object")
        encoded.append((event_id, event_type, canonical(ev.payload)))
    return encoded


def pre_encoded(events: Sequence[NewEvent], encoded: Sequence[Encoded] | None) -> Sequence[Encoded]:
    """The rows of an append given ``events`` (encoded here) or ``encoded`` (already encoded by
    the caller, who guarantees canonical payloads and well-formed types and ids), not both."""
    if encoded is None:
        return encode_events(events)
    if events:
        raise ValueError("append takes events or encoded events, not both")
    return encoded


def _no_constant(name: str) -> Any:
    """NaN and ±Infinity: Python's parser takes them, JSON (and the store) has none."""
    raise ValueError(f"{name} is not JSON")


_UNREAD = object()  # a column that holds something the store never writes
# an escaped UTF-16 surrogate: the store's JCS text never holds one (it writes characters as
# they are), and a lone one is no Unicode text (no encoder takes it)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _read_json(raw: Any) -> Any:
    """The stored JSON text of a job's output or error, parsed; :data:`_UNREAD` for a value
    that is not JSON (the row was changed outside the store), so that the job is still read."""
    try:
        if isinstance(raw, bytes | bytearray | memoryview):  # (SQLite reads text as bytes)
            raw = bytes(raw).decode("utf-8")
        value = None if raw is None else json.loads(raw, parse_constant=_no_constant)
        if type(raw) is str and _SURROGATE_ESCAPE.search(raw):
            json.dumps(value, ensure_ascii=False).encode()  # a lone surrogate fails here
        return value
    except (ValueError, TypeError, RecursionError):
        return _UNREAD  # not UTF-8, not JSON, not text, nested too deeply, not Unicode


def job_from_row(row: Sequence[Any]) -> JobRecord:
    """A row of :attr:`LogSql.job_select`. An output or error that is not JSON is read as
    ``None`` and named in ``unreadable``."""
    output, error = _read_json(row[11]), _read_json(row[12])
    unreadable: tuple[str, ...] = ()
    if output is _UNREAD or error is _UNREAD:
        unreadable = tuple(
            name for name, value in (("output", output), ("error", error)) if value is _UNREAD
        )
        output = None if output is _UNREAD else output
        error = None if error is _UNREAD else error
    return JobRecord(
        job_id=row[0],
        namespace=row[1],
        status=row[2],
        plan_name=row[3],
        idempotency_key=row[4],
        submitted_by=row[5],
        created_at=row[6],
        updated_at=row[7],
        attempt_id=row[8],
        lease_owner=row[9],
        lease_expires_at=row[10],
        output=output,
        error=error,
        version=int(row[13]),
        head_hash=row[14],
        unreadable=unreadable,
    )


def event_from_row(row: Sequence[Any]) -> StoredEvent:
    """The event of a row of :data:`EVENT_COLUMNS`.

    Raises:
        UnreadableEventError: the row holds a value of another type than the store writes.
    """
    recorded = row[6]
    return checked_event(
        row, recorded if recorded is None or isinstance(recorded, str) else str(recorded)
    )


def fenced(job_id: str, fence: str, current: str | None) -> FencedError:
    return FencedError(
        f"job {job_id}: write fenced off — attempt {fence} no longer holds the lease "
        f"(current attempt: {current})",
        job_id=job_id,
        fence=fence,
        current=current,
    )


def conflict(job_id: str, expected: int, actual: int) -> ConflictError:
    return ConflictError(
        f"job {job_id}: expected version {expected}, but the log is at {actual}",
        job_id=job_id,
        expected=expected,
        actual=actual,
    )


def head_moved(job_id: str, version: int) -> ConflictError:
    """The log is at ``version`` but its last chain hash is not the one the writer holds."""
    return ConflictError(
        f"job {job_id}: the chain head at version {version} is not the one this writer holds",
        job_id=job_id,
        expected=version,
        actual=version,
    )


def check_head(
    job_id: str, job_row: Any, head_row: Any, expected_version: int, fence: str | None
) -> str | None:
    """Check a locked job's fence and version; return its head hash (``None`` when empty)."""
    if job_row is None:
        raise JobNotFound(job_id)
    attempt_id = job_row[0]
    version, head_hex = head_row if head_row is not None else (0, None)
    if fence is not None and attempt_id != fence:
        raise fenced(job_id, fence, attempt_id)
    if version != expected_version:
        raise conflict(job_id, expected_version, version)
    return head_hex


def chain_events(
    job_id: str, version: int, head: bytes, encoded: Sequence[Encoded]
) -> list[StoredEvent]:
    """The rows of ``encoded`` chained onto the head ``(version, head)`` (``head`` the raw
    ``H_version``, empty for an empty log): ``H_i`` is computed here, once, from the head —
    never from the whole log."""
    previous = head
    stored = []
    for event_id, event_type, payload in encoded:
        version += 1
        previous = chain_next(previous, event_id, event_type, payload)
        stored.append(StoredEvent(job_id, version, event_id, event_type, payload, previous.hex()))
    return stored


def _check_status(status: str) -> str:
    if status not in JOB_STATUSES:
        raise ConfigError(
            f"unknown job status {status!r}", hint=f"Use one of: {', '.join(JOB_STATUSES)}."
        )
    return status


# The hint of the StoreUnavailable a write raises when the disk holding the database is full
# (SQLite: SQLITE_FULL; PostgreSQL: SQLSTATE 53100).
FULL_DISK_HINT = (
    "The disk holding the database is full (or the database reached its size limit): free "
    "space. Nothing recorded is lost; a job whose run gave up meanwhile is taken up again by a "
    "worker once its lease expires."
)

# newest first; the job id breaks ties so that paging is stable (each filter has an index in
# this order: migration 8)
JOBS_SORT = "ORDER BY j.created_at DESC, j.job_id DESC"
JOBS_ORDER = f"{JOBS_SORT} LIMIT ? OFFSET ?"


def jobs_where(f: JobFilter) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause (``""`` or starting with a space) of a job listing over ``jobs j``
    and its parameters, the limit and offset of :data:`JOBS_ORDER` last.

    Raises:
        ConfigError: an unknown status, a filter holding a NUL or text that is not UTF-8, or a
            limit or offset out of range.
    """
    where: list[str] = []
    params: list[Any] = []
    if f.status:
        for s in f.status:
            _check_status(s)
        where.append("j.status IN (" + ", ".join("?" for _ in f.status) + ")")
        params.extend(f.status)
    for text in (f.namespace, f.plan_name, f.parent, *(f.status or ())):
        if text is not None and unmatchable(text):
            raise ConfigError(f"filter value {text!r} holds a NUL or a byte that is not UTF-8")
    if f.namespace is not None:
        where.append("j.namespace = ?")
        params.append(f.namespace)
    if f.plan_name is not None:
        where.append("j.plan_name = ?")
        params.append(f.plan_name)
    if f.parent is not None:
        where.append(
            "j.job_id IN (SELECT c.child_job_id FROM job_children c WHERE c.parent_job_id = ?)"
        )
        params.append(f.parent)
    for key, value in f.tags:  # (checked by the caller: affidavit.core.tags.check_tag_filter)
        if unmatchable(key) or unmatchable(value):
            raise ConfigError(
                f"tag filter {key!r}={value!r} holds a NUL or a byte that is not UTF-8"
            )
        where.append(
            "j.job_id IN (SELECT t.job_id FROM job_tags t WHERE t.key = ? AND t.value = ?)"
        )
        params.extend((key, value))
    if f.before is not None:
        if unmatchable(f.before):
            raise ConfigError(f"job id {f.before!r} holds a NUL or a byte that is not UTF-8")
        # a row value of plain operands (the cursor's created_at an uncorrelated scalar
        # subquery), so both databases read it as a range of the listing's index; a cursor
        # naming no job compares as NULL and lists nothing (see SqlStore.list_jobs)
        where.append(
            "(j.created_at, j.job_id) < ((SELECT c.created_at FROM jobs c WHERE c.job_id = ?), ?)"
        )
        params.extend((f.before, f.before))
    if not (1 <= f.limit <= MAX_INT64 and 0 <= f.offset <= MAX_INT64):
        raise ConfigError("limit must be ≥ 1 and offset ≥ 0 (and both below 2^63)")
    params.extend((f.limit, f.offset))
    return (" WHERE " + " AND ".join(where) if where else ""), params
