"""SQL shared by both backends: the store logic over a backend's connections (reads, and
writes each in a transaction of its own). The transaction logic, and how the backends differ,
are in :mod:`affidavit.store._sql`; the SQL here uses its ``?`` placeholders too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from affidavit.core import crash
from affidavit.core.chain import GENESIS
from affidavit.core.errors import (
    ConfigError,
    JobNotFound,
    MigrationError,
    NoSchemaError,
)
from affidavit.core.ids import new_job_id
from affidavit.core.privacy import JobCipher
from affidavit.core.seal import PublicKey, Seal
from affidavit.store import migrations
from affidavit.store._apikeys import ApiKeyReads
from affidavit.store._children import parent_sql
from affidavit.store._seals import (
    KEYS_SELECT,
    LEGACY_SEAL_SELECT,
    SEAL_SELECT,
    SEALS_V2_MIGRATION,
    key_from_row,
    seal_from_row,
)
from affidavit.store._sql import BY_JOB_ID, Cursor, SqlTransaction
from affidavit.store._sql_rows import (
    JOBS_ORDER,
    JOBS_SORT,
    MAX_INT64,
    encode_events,
    event_from_row,
    job_from_row,
    jobs_where,
    pre_encoded,
)
from affidavit.store._subjects import (
    _KEY_OF_JOB,
    SUBJECT_AFTER,
    SUBJECT_GROUP,
    SUBJECT_LIST,
    SUBJECTS_MIGRATION,
    SubjectKeys,
    SubjectRow,
    subject_row,
)
from affidavit.store._tlog import TLOG_MIGRATION
from affidavit.store._trust import TRUST_MIGRATION
from affidavit.store.base import (
    Claimed,
    Encoded,
    JobFilter,
    JobRecord,
    NewEvent,
    NewJob,
    StoredEvent,
    T,
    unmatchable,
)
from affidavit.store.queues import Placement, place_job
from affidavit.store.tags import RETENTION_MIGRATION, tag_job

if TYPE_CHECKING:
    from affidavit.store._snapshot import SqlSnapshot


#: The most seals one statement of :meth:`get_seals` reads (SQLite binds at most 32766).
_SEALS_AT_ONCE = 500


class SqlStore(ApiKeyReads, ABC):
    """The :class:`~affidavit.store.base.Store` methods both backends share. A backend supplies
    connections: ``_reader()`` (a cursor for reads) and ``transaction()``."""

    url: str
    backend: str
    log_sql = BY_JOB_ID
    seal_select = SEAL_SELECT  # (LEGACY_SEAL_SELECT on a copy made before migration 12)
    tlog_tables = True  # (False on a copy made before migration 10)
    trust_tables = True  # (False on a copy made before migration 15, read as it is)
    retention_tables = True  # (False on a copy made before migration 25: no tags, no archive)
    subject_tables = True  # (False on a copy made before migration 24, read as it is)
    _subject_keys: SubjectKeys | None = None

    @property
    def subjects(self) -> SubjectKeys:
        """This store's key provider and the data keys its writers use (see
        :class:`~affidavit.store._subjects.SubjectKeys`)."""
        if self._subject_keys is None:
            self._subject_keys = SubjectKeys()
        return self._subject_keys

    @abstractmethod
    def _reader(self) -> AbstractContextManager[Cursor]: ...

    def _log_reader(self) -> AbstractContextManager[Cursor]:
        """:meth:`_reader` for a log in key order (``list_events``, whole or a page): where a
        backend's planner may sort the job's whole log for the read (for each page of a paged
        read), it is told not to (see :class:`~affidavit.store.postgres.PostgresStore`)."""
        return self._reader()

    @abstractmethod
    def transaction(self, *, durable: bool = True) -> AbstractContextManager[SqlTransaction]: ...

    @abstractmethod
    def snapshot(self, *, lenient_text: bool = False) -> AbstractContextManager[SqlSnapshot]: ...

    def _q(self, sql: str) -> str:
        return sql

    def _read_rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._reader() as cur:
            cur.execute(self._q(sql), params)
            return list(cur.fetchall())

    @abstractmethod
    def schema_version(self) -> int: ...

    def check_schema(self) -> None:
        """Refuse a database whose schema this affidavit cannot read as it is: what a store
        opened read-only checks instead of migrating. Pending migrations are accepted when a
        read-only store still reads the schema before each
        (``Migration.older_schema_readable``), so an auditor can verify a copy made before
        such an upgrade.

        Raises:
            MigrationError: no affidavit schema, a pending migration that changes what is
                read, or a newer or different schema.
        """
        name = "sqlite" if self.backend == "sqlite" else "postgres"
        if self.schema_version() == 0:
            raise NoSchemaError(
                "the database holds no affidavit schema",
                hint="Point --db at an affidavit database (a command that writes, such as "
                "`affidavit db migrate`, creates the schema).",
            )
        known = migrations.load(name)
        applied = [
            int(r[0]) for r in self._read_rows(f"SELECT version FROM {migrations.VERSION_TABLE}")
        ]
        pending = migrations.pending(name, applied, known)  # (raises for a newer schema)
        if any(m.version == SEALS_V2_MIGRATION for m in pending):
            self.seal_select = LEGACY_SEAL_SELECT  # (seals have no version column yet)
        if any(m.version == TLOG_MIGRATION for m in pending):
            self.tlog_tables = False  # (no log tables yet: a job has no leaves)
        if any(m.version == TRUST_MIGRATION for m in pending):
            self.trust_tables = False  # (no outcome and no trust seal yet)
        if any(m.version == RETENTION_MIGRATION for m in pending):
            self.retention_tables = False  # (no tag, no archived job yet)
        if any(m.version == SUBJECTS_MIGRATION for m in pending):
            self.subject_tables = False  # (no job has a subject yet)
        if not all(m.older_schema_readable for m in pending):
            raise MigrationError(
                f"the database schema is at version {max(applied)}, older than this "
                f"affidavit's ({known[-1].version}); it is not migrated when opened read-only",
                hint="Run `affidavit db migrate` with write access to the database first.",
            )

    def claim(
        self,
        *,
        owner: str,
        attempt_id: str,
        now: float,
        lease_seconds: float,
        job_id: str | None = None,
        skip: Collection[str] = (),
        with_log: bool = False,
    ) -> Claimed | None:
        with self.transaction(durable=False) as tx:
            tx.commit_with_next_read()
            return tx.claim(
                owner=owner,
                attempt_id=attempt_id,
                now=now,
                lease_seconds=lease_seconds,
                job_id=job_id,
                skip=skip,
                with_log=with_log,
            )

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent] = (),
        *,
        expected_version: int,
        fence: str | None = None,
        encoded: Sequence[Encoded] | None = None,
        head: bytes | None = None,
        durable: bool = True,
    ) -> list[StoredEvent]:
        rows = pre_encoded(events, encoded)
        with self.transaction(durable=durable) as tx:
            return tx.append(
                job_id, encoded=rows, expected_version=expected_version, fence=fence, head=head
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
        placement: Placement | None = None,
        parent: tuple[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
        subject: str | None = None,
    ) -> tuple[JobRecord, bool]:
        new = NewJob(
            namespace, plan_name, idempotency_key, submitted_by, events, placement, parent, tags
        )
        return self.create_jobs([replace(new, subject=subject, job_id=job_id)], durable=durable)[0]

    def create_jobs(
        self, jobs: Sequence[NewJob], *, durable: bool = True
    ) -> list[tuple[JobRecord, bool]]:
        encoded = [encode_events(new.events) for new in jobs]
        rows = [
            (
                new.job_id or new_job_id(),
                new.namespace,
                new.plan_name,
                new.idempotency_key,
                new.submitted_by,
            )
            for new in jobs
        ]
        with self.transaction(durable=durable) as tx:
            made = tx.insert_jobs(rows, "pending")
            found = [
                _first_writes(tx, new, first, job) if created else (job, False)
                for new, first, (job, created) in zip(jobs, encoded, made, strict=True)
            ]
            if any(new.parent is not None for new in jobs):
                crash.crash_point("child.before_create_commit")  # (rolled back: none exists)
            return found

    def job_parent(self, job_id: str) -> str | None:
        if unmatchable(job_id):
            return None
        with self._reader() as cur:
            cur.execute(self._q(parent_sql()), (job_id,))
            row = cur.fetchone()
        return None if row is None else str(row[0])

    def get_job(self, job_id: str) -> JobRecord:
        if unmatchable(job_id):  # no job can have it
            raise JobNotFound(job_id)
        with self._reader() as cur:
            cur.execute(self._q(f"{self.log_sql.job_select} WHERE j.job_id = ?"), (job_id,))
            row = cur.fetchone()
        if row is None:
            raise JobNotFound(job_id)
        return job_from_row(row)

    def list_jobs(self, filters: JobFilter | None = None) -> list[JobRecord]:
        where, params = jobs_where(filters or JobFilter())
        # The page's ids first, off an index and reading no other column; only then each
        # listed job's chain head (its last event): a deep offset skips index entries, not
        # joins.
        page = f"SELECT j.job_id FROM jobs j{where} {JOBS_ORDER}"
        sql = f"{self.log_sql.job_select} WHERE j.job_id IN ({page}) {JOBS_SORT}"
        with self._reader() as cur:
            cur.execute(self._q(sql), params)
            rows = cur.fetchall()
            if not rows and filters is not None and filters.before is not None:
                cur.execute(self._q("SELECT 1 FROM jobs WHERE job_id = ?"), (filters.before,))
                if cur.fetchone() is None:
                    raise JobNotFound(filters.before)
            return [job_from_row(r) for r in rows]

    def list_events(
        self, job_id: str, *, after_version: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        sql = self.log_sql.after
        if not 0 <= after_version <= MAX_INT64 or (
            limit is not None and not 1 <= limit <= MAX_INT64
        ):
            raise ConfigError("after_version must be ≥ 0 and limit ≥ 1 (and both below 2^63)")
        if unmatchable(job_id):
            return []  # no job can have it
        params: list[Any] = [job_id, after_version]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._log_reader() as cur:
            cur.execute(self._q(sql), params)
            return [event_from_row(r) for r in cur.fetchall()]

    def iter_events(
        self, job_id: str, *, batch: int = 1000, after_version: int = 0, limit: int | None = None
    ) -> Iterator[StoredEvent]:
        after, left = after_version, limit
        while left is None or left > 0:
            size = batch if left is None else min(batch, left)
            page = self.list_events(job_id, after_version=after, limit=size)
            yield from page
            if len(page) < size:
                return
            after = page[-1].version
            left = None if left is None else left - len(page)

    def with_text_fallback(self, read: Callable[[bool], T]) -> T:
        # (a backend whose text is always valid: nothing to fall back to; SQLite overrides it)
        return read(False)

    def get_seal(self, job_id: str) -> Seal | None:
        with self._reader() as cur:
            cur.execute(self._q(self.seal_select), (job_id,))
            row = cur.fetchone()
        return seal_from_row(row) if row is not None else None

    def get_seals(self, job_ids: Sequence[str]) -> dict[str, Seal]:
        ids = [j for j in dict.fromkeys(job_ids) if not unmatchable(j)]
        select = self.seal_select.removesuffix("job_id = ?")
        found: dict[str, Seal] = {}
        for i in range(0, len(ids), _SEALS_AT_ONCE):
            chunk = ids[i : i + _SEALS_AT_ONCE]
            with self._reader() as cur:
                cur.execute(self._q(f"{select}job_id IN ({', '.join('?' * len(chunk))})"), chunk)
                for row in cur.fetchall():
                    seal = seal_from_row(row)
                    found[seal.job_id] = seal
        return found

    def signing_keys(self) -> list[PublicKey]:
        with self._reader() as cur:
            cur.execute(self._q(KEYS_SELECT))
            return [key_from_row(r) for r in cur.fetchall()]

    # --- subjects -----------------------------------------------------------------------------

    def job_key(self, job_id: str) -> tuple[str, JobCipher | None] | None:
        """For a reader: ``job_id``'s subject id and the cipher of its data key (``None`` once
        the subject is erased), or ``None`` for a job without a subject. Read each time: a
        reader never shows a value whose key was erased since."""
        if not self.subject_tables or unmatchable(job_id):
            return None
        rows = self._read_rows(_KEY_OF_JOB, (job_id,))
        if not rows:
            return None
        if rows[0][1] is None:
            return str(rows[0][0]), None
        return str(rows[0][0]), self.subjects.cipher(job_id, rows[0])

    def writer_cipher(self, job_id: str) -> JobCipher | None:
        """The cipher a writer of ``job_id`` seals with (``None``: no subject), kept for the
        job's next writes in this process.

        Raises:
            SubjectError: the job's subject was erased.
        """
        known, cipher = self.subjects.cached(job_id)
        if known or not self.subject_tables:
            return cipher
        rows = self._read_rows(_KEY_OF_JOB, (job_id,))
        cipher = self.subjects.cipher(job_id, rows[0] if rows else None)
        self.subjects.remember(job_id, cipher)
        return cipher

    def list_subjects(
        self, subject_id: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> list[SubjectRow]:
        """The subjects (or the one of ``subject_id``), oldest first: ids, job counts, first
        and last use, erasure; never the subjects themselves. ``after``: only those after the
        subject of that id in this order (none when no subject has it); ``limit``: at most
        that many."""
        if not self.subject_tables:
            return []
        params: list[Any] = [subject_id] if subject_id else []
        where = "WHERE s.subject_id = ?" if subject_id else ""
        if after is not None:
            where = (where + " AND " if where else "WHERE ") + SUBJECT_AFTER
            params += [after, after, after]
        sql = SUBJECT_LIST + where + SUBJECT_GROUP
        if limit is not None:
            if not 1 <= limit <= MAX_INT64:
                raise ConfigError("limit must be ≥ 1 (and below 2^63)")
            sql += " LIMIT ?"
            params.append(limit)
        return [subject_row(r) for r in self._read_rows(sql, params)]

    def subject_job_ids(self, subject_id: str) -> list[str]:
        """The ids of the subject's jobs, oldest first."""
        if not self.subject_tables:
            return []
        rows = self._read_rows(
            "SELECT job_id FROM job_subjects WHERE subject_id = ? ORDER BY created_at, job_id",
            (subject_id,),
        )
        return [str(r[0]) for r in rows]

    def scrub_erased(self) -> bool:
        """Remove the copies the database's files may still hold of deleted key rows (the
        backend's own way: see docs/privacy.md); whether it could all be done."""
        return True


def _first_writes(
    tx: SqlTransaction, new: NewJob, encoded: Sequence[Encoded], job: JobRecord
) -> tuple[JobRecord, bool]:
    """The rest of the creation of ``job`` (inserted in ``tx`` as ``new`` asks): its queue,
    parent link, tags, subject and first events."""
    if new.placement is not None:
        place_job(tx, job.job_id, new.placement)
    if new.parent is not None:
        tx.link_child(job.job_id, *new.parent)
    if new.tags:
        tag_job(tx, job.job_id, new.tags)
    if new.subject is not None:
        tx.bind_subject(job.job_id, new.subject)
    else:  # (created just now without one: its writers need not look its key up)
        tx.no_subject(job.job_id)
    if encoded:  # (a job of this transaction: its log is empty, no head to read)
        stored = tx.append(job.job_id, encoded=encoded, expected_version=0, head=GENESIS)
        job = replace(job, version=stored[-1].version, head_hash=stored[-1].chain_hash)
    return job, True
