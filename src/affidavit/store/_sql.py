"""SQL shared by both backends: the transaction logic of append, jobs and leases.

Backends differ only in connection handling, locking and durability (their own modules) and in
the placeholder style, which :meth:`SqlTransaction._q` converts. Every SQL string here is written
with ``?`` placeholders.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.errors import (
    ConfigError,
    ConflictError,
    FencedError,
    InvalidEventError,
    JobNotFound,
    StoreError,
)
from affidavit.core.events import utc_now
from affidavit.core.ids import new_event_id, new_job_id
from affidavit.store.base import (
    JOB_STATUSES,
    JobFilter,
    JobRecord,
    NewEvent,
    StoredEvent,
)

JOB_COLUMNS = (
    "job_id, namespace, status, plan_name, idempotency_key, submitted_by, created_at, "
    "updated_at, version, head_hash, attempt_id, lease_owner, lease_expires_at, output, error"
)
EVENT_COLUMNS = "job_id, version, event_id, type, payload, chain_hash, recorded_at"

# An encoded event: (event_id, type, canonical payload bytes).
Encoded = tuple[str, str, bytes]


class Cursor(Protocol):
    @property
    def description(self) -> Any: ...
    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...
    def executemany(self, sql: Any, params: Any, /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


_EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_EVENT_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def encode_events(events: Sequence[NewEvent]) -> list[Encoded]:
    """Canonicalize every payload once, before any lock is taken.

    Event types and ids are checked here because the chain formula separates them with spaces
    and newlines: a type or id containing one would make two different logs hash alike.
    """
    encoded: list[Encoded] = []
    for ev in events:
        event_type = str(ev.type)
        if not _EVENT_TYPE.match(event_type):
            raise InvalidEventError(
                f"invalid event type {event_type!r}",
                hint="Event types are lowercase snake_case (letters, digits, '_').",
            )
        event_id = ev.event_id or new_event_id()
        if not _EVENT_ID.match(event_id):
            raise InvalidEventError(
                f"invalid event id {event_id!r}",
                hint="Event ids are 1-128 characters of letters, digits and _ . : -",
            )
        if not isinstance(ev.payload, Mapping):
            raise InvalidEventError(f"{event_type} payload must be a JSON object")
        encoded.append((event_id, event_type, canonical(ev.payload)))
    return encoded


def _json_or_none(raw: Any) -> Any:
    if raw is None:
        return None
    if isinstance(raw, bytes | bytearray | memoryview):
        raw = bytes(raw).decode("utf-8")
    return json.loads(raw)


def job_from_row(row: Sequence[Any]) -> JobRecord:
    return JobRecord(
        job_id=row[0],
        namespace=row[1],
        status=row[2],
        plan_name=row[3],
        idempotency_key=row[4],
        submitted_by=row[5],
        created_at=row[6],
        updated_at=row[7],
        version=row[8],
        head_hash=row[9],
        attempt_id=row[10],
        lease_owner=row[11],
        lease_expires_at=row[12],
        output=_json_or_none(row[13]),
        error=_json_or_none(row[14]),
    )


def event_from_row(row: Sequence[Any]) -> StoredEvent:
    recorded = row[6]
    return StoredEvent(
        job_id=row[0],
        version=row[1],
        event_id=row[2],
        type=row[3],
        payload_bytes=bytes(row[4]),
        chain_hash=row[5],
        recorded_at=recorded if recorded is None or isinstance(recorded, str) else str(recorded),
    )


class SqlTransaction:
    """The :class:`~affidavit.store.base.Transaction` implementation over one connection that
    is already inside a transaction."""

    FOR_UPDATE = ""

    def __init__(self, cursor: Cursor) -> None:
        self._cur = cursor

    def _q(self, sql: str) -> str:
        return sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement (``?`` placeholders) in this transaction; return its rows (if any).

        For the store's own layers (migrations, the ledger); not a public query API.
        """
        self._cur.execute(self._q(sql), params)
        if self._cur.description is None:  # the statement returns no rows
            return []
        return list(self._cur.fetchall())

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        self._cur.execute(self._q(sql), params)
        return self._cur.fetchone()

    # --- events -----------------------------------------------------------------------------

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int,
        fence: str | None = None,
    ) -> list[StoredEvent]:
        return self.append_encoded(
            job_id, encode_events(events), expected_version=expected_version, fence=fence
        )

    def append_encoded(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        *,
        expected_version: int,
        fence: str | None = None,
    ) -> list[StoredEvent]:
        """Append already-canonicalized events (see :func:`encode_events`)."""
        head = self._one(
            "SELECT version, head_hash, attempt_id FROM jobs WHERE job_id = ?" + self.FOR_UPDATE,
            (job_id,),
        )
        if head is None:
            raise JobNotFound(job_id)
        version, head_hex, attempt_id = head
        if fence is not None and attempt_id != fence:
            raise FencedError(
                f"job {job_id}: write fenced off — attempt {fence} no longer holds the lease "
                f"(current attempt: {attempt_id})",
                job_id=job_id,
                fence=fence,
                current=attempt_id,
            )
        if version != expected_version:
            raise ConflictError(
                f"job {job_id}: expected version {expected_version}, but the log is at {version}",
                job_id=job_id,
                expected=expected_version,
                actual=version,
            )
        if not encoded:
            return []
        previous = bytes.fromhex(head_hex) if head_hex else GENESIS
        rows = []
        stored = []
        for event_id, event_type, payload in encoded:
            version += 1
            previous = chain_next(previous, event_id, event_type, payload)
            digest = previous.hex()
            rows.append((job_id, version, event_id, event_type, payload, digest))
            stored.append(StoredEvent(job_id, version, event_id, event_type, payload, digest))
        self._cur.executemany(
            self._q(
                "INSERT INTO events (job_id, version, event_id, type, payload, chain_hash) "
                "VALUES (?, ?, ?, ?, ?, ?)"
            ),
            rows,
        )
        self._cur.execute(
            self._q("UPDATE jobs SET version = ?, head_hash = ?, updated_at = ? WHERE job_id = ?"),
            (version, stored[-1].chain_hash, utc_now(), job_id),
        )
        return stored

    # --- jobs -------------------------------------------------------------------------------

    def create_job(
        self,
        *,
        job_id: str | None = None,
        namespace: str = "default",
        plan_name: str | None = None,
        idempotency_key: str | None = None,
        submitted_by: str | None = None,
        status: str = "pending",
    ) -> tuple[JobRecord, bool]:
        _check_status(status)
        if idempotency_key is not None:
            existing = self._one(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = ? AND idempotency_key = ?",
                (namespace, idempotency_key),
            )
            if existing is not None:
                return job_from_row(existing), False
        now = utc_now()
        new_id = job_id or new_job_id()
        row = self._one(
            f"INSERT INTO jobs ({JOB_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, NULL, NULL, NULL, NULL, NULL, NULL) "
            f"ON CONFLICT DO NOTHING RETURNING {JOB_COLUMNS}",
            (new_id, namespace, status, plan_name, idempotency_key, submitted_by, now, now),
        )
        if row is not None:
            return job_from_row(row), True
        if idempotency_key is not None:
            # A concurrent submitter with the same key committed first (PostgreSQL waits for it).
            existing = self._one(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = ? AND idempotency_key = ?",
                (namespace, idempotency_key),
            )
            if existing is not None:
                return job_from_row(existing), False
        raise StoreError(
            f"job id {new_id!r} already exists",
            hint="Choose another job id, or pass an idempotency key to get the existing job.",
        )

    def get_job(self, job_id: str, *, for_update: bool = False) -> JobRecord | None:
        row = self._one(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?"
            + (self.FOR_UPDATE if for_update else ""),
            (job_id,),
        )
        return job_from_row(row) if row is not None else None

    def update_job(
        self,
        job_id: str,
        *,
        status: str | None = None,
        output: Any = None,
        error: Any = None,
        fence: str | None = None,
    ) -> JobRecord:
        current = self.get_job(job_id, for_update=True)
        if current is None:
            raise JobNotFound(job_id)
        if fence is not None and current.attempt_id != fence:
            raise FencedError(
                f"job {job_id}: status change fenced off — attempt {fence} no longer holds "
                "the lease",
                job_id=job_id,
                fence=fence,
                current=current.attempt_id,
            )
        new_status = current.status if status is None else _check_status(status)
        out = canonical(output).decode() if output is not None else None
        err = canonical(error).decode() if error is not None else None
        row = self._one(
            "UPDATE jobs SET status = ?, output = COALESCE(?, output), "
            "error = COALESCE(?, error), updated_at = ? WHERE job_id = ? "
            f"RETURNING {JOB_COLUMNS}",
            (new_status, out, err, utc_now(), job_id),
        )
        return job_from_row(row)

    def set_lease(
        self, job_id: str, *, attempt_id: str | None, owner: str | None, expires_at: float | None
    ) -> None:
        self._cur.execute(
            self._q(
                "UPDATE jobs SET attempt_id = ?, lease_owner = ?, lease_expires_at = ? "
                "WHERE job_id = ?"
            ),
            (attempt_id, owner, expires_at, job_id),
        )


def _check_status(status: str) -> str:
    if status not in JOB_STATUSES:
        raise ConfigError(
            f"unknown job status {status!r}", hint=f"Use one of: {', '.join(JOB_STATUSES)}."
        )
    return status


class SqlStore(ABC):
    """The :class:`~affidavit.store.base.Store` methods both backends share. A backend supplies
    connections: ``_reader()`` (a cursor for reads) and ``transaction()``."""

    url: str
    backend: str

    @abstractmethod
    def _reader(self) -> AbstractContextManager[Cursor]: ...

    @abstractmethod
    def transaction(self, *, durable: bool = True) -> AbstractContextManager[SqlTransaction]: ...

    def _q(self, sql: str) -> str:
        return sql

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int,
        fence: str | None = None,
        durable: bool = True,
    ) -> list[StoredEvent]:
        encoded = encode_events(events)
        with self.transaction(durable=durable) as tx:
            return tx.append_encoded(
                job_id, encoded, expected_version=expected_version, fence=fence
            )

    def create_job(
        self,
        *,
        job_id: str | None = None,
        namespace: str = "default",
        plan_name: str | None = None,
        idempotency_key: str | None = None,
        submitted_by: str | None = None,
        events: Sequence[NewEvent] = (),
        durable: bool = True,
    ) -> tuple[JobRecord, bool]:
        encoded = encode_events(events)
        with self.transaction(durable=durable) as tx:
            job, created = tx.create_job(
                job_id=job_id,
                namespace=namespace,
                plan_name=plan_name,
                idempotency_key=idempotency_key,
                submitted_by=submitted_by,
            )
            if created and encoded:
                tx.append_encoded(job.job_id, encoded, expected_version=0)
                refreshed = tx.get_job(job.job_id)
                assert refreshed is not None
                job = refreshed
            return job, created

    def get_job(self, job_id: str) -> JobRecord:
        with self._reader() as cur:
            cur.execute(self._q(f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?"), (job_id,))
            row = cur.fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return job_from_row(row)

    def list_jobs(self, filters: JobFilter | None = None) -> list[JobRecord]:
        f = filters or JobFilter()
        where: list[str] = []
        params: list[Any] = []
        if f.status:
            for s in f.status:
                _check_status(s)
            where.append("status IN (" + ", ".join("?" for _ in f.status) + ")")
            params.extend(f.status)
        if f.namespace is not None:
            where.append("namespace = ?")
            params.append(f.namespace)
        if f.plan_name is not None:
            where.append("plan_name = ?")
            params.append(f.plan_name)
        if f.limit < 1 or f.offset < 0:
            raise ConfigError("limit must be ≥ 1 and offset ≥ 0")
        sql = f"SELECT {JOB_COLUMNS} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, job_id DESC LIMIT ? OFFSET ?"
        params.extend((f.limit, f.offset))
        with self._reader() as cur:
            cur.execute(self._q(sql), params)
            return [job_from_row(r) for r in cur.fetchall()]

    def list_events(
        self, job_id: str, *, after_version: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        sql = (
            f"SELECT {EVENT_COLUMNS} FROM events WHERE job_id = ? AND version > ? ORDER BY version"
        )
        params: list[Any] = [job_id, after_version]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._reader() as cur:
            cur.execute(self._q(sql), params)
            return [event_from_row(r) for r in cur.fetchall()]

    def iter_events(self, job_id: str, *, batch: int = 1000) -> Iterator[StoredEvent]:
        after = 0
        while True:
            page = self.list_events(job_id, after_version=after, limit=batch)
            yield from page
            if len(page) < batch:
                return
            after = page[-1].version
