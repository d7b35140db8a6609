"""The storage contract shared by both backends.

A :class:`Store` holds jobs and their append-only, hash-chained event logs (and, as later layers
land, the invocation ledger, seals, claims and trust) in one database, so that one transaction can
write events and ledger rows together. Backends: :mod:`affidavit.store.sqlite` and
:mod:`affidavit.store.postgres`, chosen by URL in :func:`affidavit.store.open_store`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from affidavit.store._children import ChildTransaction
from affidavit.store._claims import ClaimsTransaction
from affidavit.store._lease_protocol import CancelTransaction, LeaseTransaction, LimitTransaction
from affidavit.store._tlog_protocol import TlogReader, TlogWriter
from affidavit.store._trust import TrustTransaction
from affidavit.store._types import (
    JOB_STATUSES,
    TERMINAL_STATUSES,
    UNREADABLE_HINT,
    ApiKeyRow,
    CancelRequest,
    Claimed,
    ClockOffset,
    Encoded,
    JobFilter,
    JobRecord,
    JobStatus,
    LedgerColumns,
    LedgerRow,
    NewEvent,
    NewJob,
    NextClaim,
    StoredEvent,
    T,
    checked_event,
    event_row_problem,
    unmatchable,
)

if TYPE_CHECKING:
    from affidavit.core.privacy import JobCipher
    from affidavit.core.seal import PublicKey, Seal
    from affidavit.store._sealkeys import SealKeyAdmission
    from affidavit.store._subjects import SubjectKeys, SubjectRow
    from affidavit.store.migrations import Migration
    from affidavit.store.queues import Placement

# (the contract's values are defined in affidavit.store._types and named here too)
__all__ = [
    "JOB_STATUSES",
    "TERMINAL_STATUSES",
    "UNREADABLE_HINT",
    "ApiKeyRow",
    "CancelRequest",
    "Claimed",
    "ClockOffset",
    "Encoded",
    "JobFilter",
    "JobRecord",
    "JobStatus",
    "LedgerColumns",
    "LedgerRow",
    "NewEvent",
    "NewJob",
    "NextClaim",
    "Snapshot",
    "Store",
    "StoredEvent",
    "T",
    "TlogReader",
    "TlogWriter",
    "Transaction",
    "checked_event",
    "event_row_problem",
    "unmatchable",
]


class Transaction(
    LeaseTransaction,
    ChildTransaction,
    CancelTransaction,
    LimitTransaction,
    TlogWriter,
    TrustTransaction,
    ClaimsTransaction,
    Protocol,
):
    """Writes that commit or roll back together. Obtained from :meth:`Store.transaction`.
    Claims of jobs, leases, cancel requests and limits are declared in
    :mod:`affidavit.store._lease_protocol`."""

    @overload
    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent] = (),
        *,
        expected_version: int,
        fence: str | None = None,
        encoded: Sequence[Encoded] | None = None,
        head: bytes | None = None,
        hashes: Literal[False] = False,
    ) -> list[StoredEvent]: ...

    @overload
    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent] = (),
        *,
        expected_version: int,
        fence: str | None = None,
        encoded: Sequence[Encoded] | None = None,
        head: bytes | None = None,
        hashes: Literal[True],
    ) -> list[bytes]: ...

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent] = (),
        *,
        expected_version: int,
        fence: str | None = None,
        encoded: Sequence[Encoded] | None = None,
        head: bytes | None = None,
        hashes: bool = False,
    ) -> list[StoredEvent] | list[bytes]:
        """Append ``events`` to ``job_id``'s log, chained from its head: the one way into a log.

        ``encoded``, instead of ``events``: the events already encoded as ``(event_id, type,
        JCS payload bytes)`` (the caller guarantees the bytes are canonical and the type and id
        well-formed; ids of the store's form come from :func:`affidavit.core.ids.new_event_ids`).

        ``head``, the raw chain hash of event ``expected_version`` (``b""`` when it is 0), is for
        a writer that knows it because it wrote that event: the append is refused exactly as
        without it, but the head need not be read back.

        ``hashes=True`` returns only the new events' raw chain hashes, in order (the last is the
        new head; none for no events) — what a run keeps of an append — instead of the events.

        Raises:
            JobNotFound: no such job.
            FencedError: ``fence`` is given and is not the job's current attempt id.
            ConflictError: ``expected_version`` is not the job's current version (or ``head``
                is not its head).
            CanonicalizationError: a payload is not representable (nothing is written).
            ValueError: both ``events`` and ``encoded`` are given.
        """
        ...

    def bind_subject(self, job_id: str, subject: str) -> str:
        """Make ``job_id`` a job of ``subject`` (see :mod:`affidavit.store._subjects`)."""
        ...

    def job_cipher(self, job_id: str) -> JobCipher | None:
        """The writer's cipher of ``job_id``'s subject; ``None`` without one."""
        ...

    def lock_subject(self, subject_id: str) -> tuple[str | None, str | None] | None:
        """Lock the subject's row; ``(erased_at, receipt)``, ``None`` for no such subject."""
        ...

    def subject_jobs_locked(self, subject_id: str) -> list[tuple[str, str]]:
        """``(job_id, status)`` of the subject's jobs, their rows locked."""
        ...

    def subject_key_id(self, subject_id: str) -> str | None: ...

    def erase_subject(
        self, subject_id: str, *, at: str, reason: str | None, receipt: str, leaf: bytes
    ) -> None:
        """Delete the subject's data key, record the erasure and queue its log leaf."""
        ...

    def head(self, job_id: str) -> tuple[int, bytes]:
        """The job's last version and the raw chain hash of that event (``0, b""`` for an
        empty log), read under the job's lock: what a writer that lost track of whether its
        last commit landed compares with the head that commit would have made.

        Raises:
            JobNotFound: no such job.
        """
        ...

    def list_events(self, job_id: str) -> list[StoredEvent]:
        """The job's whole log in version order, read in this transaction: a writer that
        holds the job's lock reads it without asking the store for a second connection."""
        ...

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
        """Insert a job row; with an ``idempotency_key`` already used in ``namespace``, return
        the existing job and ``False`` instead."""
        ...

    def get_job(self, job_id: str, *, for_update: bool = False) -> JobRecord | None: ...

    def update_job(
        self,
        job_id: str,
        *,
        status: str | None = None,
        output: Any = None,
        error: Any = None,
        fence: str | None = None,
    ) -> JobRecord:
        """Change a job's status (and record its output or error), fenced like ``append``."""
        ...

    def set_status(
        self, job_id: str, *, status: str, fence: str, output: Any = None, error: Any = None
    ) -> None:
        """:meth:`update_job` for the writer holding the job's lease under ``fence`` that has
        appended in this transaction (a run): that append locked the job and checked the
        fence, so nothing is read back — on PostgreSQL the update travels with the commit.
        The update names ``fence`` too, and changes nothing under another attempt."""
        ...

    # The invocation ledger (one row per (job, idempotency key): the fate of one tool
    # invocation).

    def ledger_get(self, job_id: str, key: str) -> LedgerRow | None:
        """The ledger row of ``key`` in ``job_id``, if any."""
        ...

    def ledger_list(self, job_id: str) -> list[LedgerRow]:
        """Every ledger row of the job, in key order."""
        ...

    def ledger_open(self, job_id: str) -> list[LedgerRow]:
        """The job's rows still ``started`` (invocations begun and never finished)."""
        ...

    def ledger_insert(
        self,
        *,
        job_id: str,
        key: str,
        node_id: str,
        step_id: str,
        tool_name: str,
        args_hash: str,
        invocation_id: str,
        attempt_id: str | None,
        presumed_new: bool = False,
    ) -> bool:
        """Insert a ``started`` row; ``False`` if the key already has one (the insert that
        only one attempt can win). The started events are appended next, in the same
        transaction. With
        ``presumed_new`` (the caller knows of no row for the key) a backend may send the insert
        without waiting for its answer and return ``True``: if a row was there after all, the
        transaction fails as a whole with :class:`~affidavit.core.errors.LedgerRowExists` and
        writes nothing."""
        ...

    def ledger_restart(
        self, job_id: str, key: str, *, invocation_id: str, attempt_id: str | None
    ) -> None:
        """Move a ``failed`` (or resolved-as-lost) row back to ``started`` for a new try."""
        ...

    def ledger_finish(
        self,
        job_id: str,
        key: str,
        *,
        status: str,
        result: Any = None,
        error: Any = None,
        result_jcs: bytes | None = None,
    ) -> None:
        """Mark the row ``committed`` (with its result) or ``failed`` (with the error). A
        committed row is never changed again. ``result_jcs``: the result's canonical bytes,
        when the caller has them already."""
        ...

    # API keys of the HTTP API.

    def apikey_insert(self, row: ApiKeyRow) -> None: ...

    def apikey_revoke(self, key_id: str, at: str) -> ApiKeyRow | None: ...

    # Statements for the layers that keep their own tables in this database (claims and
    # trust): SQL with ``?`` placeholders, run inside this transaction.

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement that returns no rows (its error may surface at the next read or
        at commit, still inside this transaction)."""
        ...

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one row-returning statement and return its rows."""
        ...

    # Seals and their public keys.

    def seal_insert(self, seal: Seal, *, leaf: bytes | None = None, queued_at: float = 0.0) -> None:
        """Store a job's seal; a job that already has one keeps it, nothing written. ``leaf``:
        the seal's transparency-log leaf, queued for the sequencer (at ``queued_at``) in the
        same transaction if this seal is the one stored. Nothing is read back: on PostgreSQL
        both travel with the commit."""
        ...

    def seal_get(self, job_id: str) -> Seal | None: ...

    def seal_chain_hashes(self, job_id: str) -> list[bytes]:
        """The raw stored chain hashes of the job's events in version order (the leaves of a v2
        seal's ``events_root``)."""
        ...

    def key_register(self, key: PublicKey, *, created_at: str) -> None:
        """Record a public key (a key id already known is left as it is). Nothing to wait
        for: a backend may send it with the next round trip."""
        ...

    def key_retire(self, key_id: str, *, retired_at: str) -> None: ...

    def keys_list(self) -> list[PublicKey]: ...

    def seal_key_admit(self, key: PublicKey, *, at: str) -> SealKeyAdmission:
        """Whether ``key`` may seal in this database (active, retired, unregistered, or its
        key id recorded with another public key), registering it as the first key if the
        database has none: two transactions racing on an empty database register one key."""
        ...


class Snapshot(TlogReader, Protocol):
    """A consistent, read-only view of the database (one read transaction), obtained from
    :meth:`Store.snapshot`. Every read sees the same moment, even while workers write."""

    def get_job(self, job_id: str) -> JobRecord | None: ...

    def job_row(self, job_id: str) -> dict[str, Any] | None:
        """The job row's status, output, error, namespace, plan name, submitter and idempotency
        key by column name, as stored (the output and error as their JSON text, not parsed);
        ``None`` for no such job."""
        ...

    def list_job_ids(self, filters: JobFilter) -> list[str]:
        """The ids of the jobs :meth:`Store.list_jobs` lists for ``filters``, in its order,
        reading no other column of their rows."""
        ...

    def iter_job_ids(self, filters: JobFilter, *, batch: int = ...) -> Iterator[str]:
        """The ids of every job ``filters`` select (their limit and offset ignored), in the
        order of :meth:`list_job_ids`, read by one streamed query: no page re-reads the ones
        before it."""
        ...

    def iter_orphans(
        self, job_id: str | None = None, *, batch: int = ...
    ) -> Iterator[tuple[str, str]]:
        """``(job_id, what)`` for every job id with ``events``, ``ledger rows`` or a ``seal``
        but no job row (only ``job_id``'s when given), ordered by job id, each pair once."""
        ...

    def iter_orphan_event_rows(
        self, job_id: str | None = None, *, batch: int = ...
    ) -> Iterator[tuple[str, int, str, str, bytes, str]]:
        """``(job_id, version, event_id, type, payload bytes, chain_hash)`` of the events of
        job ids without a job row (only ``job_id``'s when given), in the order of
        :meth:`iter_orphans`, each log in log order."""
        ...

    def iter_misplaced_events(
        self, *, batch: int = ...
    ) -> Iterator[tuple[str, int, int, str | None]]:
        """``(job_id, version, position, holder)`` of every event row of a job that no read of
        the job's log returns (see :meth:`SqlSnapshot.iter_misplaced_events`)."""
        ...

    def iter_events(self, job_id: str, *, batch: int = ...) -> Iterator[StoredEvent]:
        """The job's whole log in version order, streamed ``batch`` rows at a time (memory
        does not grow with the log). ``recorded_at`` is not read."""
        ...

    def iter_event_rows(
        self, job_id: str, *, batch: int = ...
    ) -> Iterator[tuple[int, str, str, bytes, str]]:
        """``(version, event_id, type, payload bytes, chain_hash)`` of the whole log in version
        order, streamed like :meth:`iter_events` without an object per event."""
        ...

    def iter_ledger_columns(self, job_id: str, *, batch: int = ...) -> Iterator[LedgerColumns]:
        """``(idempotency_key, status, invocation_id, result text, node_id, step_id,
        tool_name, args_hash)`` per ledger row in key order, as stored (a row edited outside
        the store may hold another type than text), without an object per row."""
        ...

    def ledger_list(self, job_id: str) -> list[LedgerRow]: ...

    def iter_ledger(self, job_id: str, *, batch: int = ...) -> Iterator[LedgerRow]:
        """The job's ledger rows, streamed like :meth:`iter_events`."""
        ...

    def seal_get(self, job_id: str) -> Seal | None: ...

    def keys_list(self) -> list[PublicKey]: ...


class Store(Protocol):
    """One database holding jobs and their hash-chained event logs."""

    url: str
    backend: str

    def migrate(self, on_apply: Callable[[Migration], None] | None = None) -> list[int]:
        """Apply pending numbered migrations; the versions applied. ``on_apply(migration)``
        before each (progress for a long one, such as a table rebuild)."""
        ...

    def schema_version(self) -> int: ...

    def transaction(self, *, durable: bool = True) -> AbstractContextManager[Transaction]:
        """A write transaction: ``durable`` returns only after the commit is synced to disk,
        else it is only written (the next durable commit covers it)."""
        ...

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
        """:meth:`Transaction.append` in a transaction of its own."""
        ...

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
        """:meth:`Transaction.claim` in a transaction of its own, not waited to disk: nothing
        acts on a claim alone, and the claimer's first durable commit covers it. On
        PostgreSQL one round trip, the job's log included when ``with_log``."""
        ...

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
        """Create a job and append its first ``events`` atomically; with an idempotency key
        already used in the namespace, return the existing job (and ``False``), writing nothing.
        ``placement``: the job's queue and its place in it (None: the default queue).
        ``parent``: ``(parent_job_id, parent_step_id)`` of a child job, linked in the same
        transaction (see :mod:`affidavit.store._children`). ``tags``: the job's tags (checked
        by the caller: :func:`affidavit.core.tags.check_tags`), written in the same
        transaction (see :mod:`affidavit.store.tags`). ``subject``: the job's data subject,
        whose key seals its values (see :mod:`affidavit.store._subjects`)."""
        ...

    def create_jobs(
        self, jobs: Sequence[NewJob], *, durable: bool = True
    ) -> list[tuple[JobRecord, bool]]:
        """:meth:`create_job` of each of ``jobs`` in order, in one transaction: all created
        (or found by their keys) or none; on PostgreSQL two round trips however many."""
        ...

    @property
    def subjects(self) -> SubjectKeys:
        """The store's key provider and its writers' data keys."""
        ...

    def job_key(self, job_id: str) -> tuple[str, JobCipher | None] | None:
        """``job_id``'s subject id and data key cipher (``None`` once erased); ``None``
        without a subject. Read each time."""
        ...

    def writer_cipher(self, job_id: str) -> JobCipher | None:
        """The cipher a writer of ``job_id`` seals with (``None``: no subject), cached."""
        ...

    def list_subjects(
        self, subject_id: str | None = None, *, after: str | None = None, limit: int | None = None
    ) -> list[SubjectRow]:
        """The subjects (or the one of ``subject_id``), oldest first; ``after``: those after
        the subject of that id (none when it is no subject's); ``limit``: at most that many."""
        ...

    def subject_job_ids(self, subject_id: str) -> list[str]: ...

    def scrub_erased(self) -> bool:
        """Remove what the database's files still hold of deleted key rows; whether it could
        all be done."""
        ...

    def get_job(self, job_id: str) -> JobRecord:
        """Raises :class:`JobNotFound`."""
        ...

    def job_parent(self, job_id: str) -> str | None:
        """The job that created ``job_id`` as a child job (``ctx.start_job``), if any."""
        ...

    def list_jobs(self, filters: JobFilter | None = None) -> list[JobRecord]:
        """Jobs newest first (``created_at``, the job id breaking ties), filtered and paged by
        ``filters``.

        Raises:
            JobNotFound: ``filters.before`` names no job.
            ConfigError: a filter out of range or holding text no row can hold.
        """
        ...

    def list_events(
        self, job_id: str, *, after_version: int = 0, limit: int | None = None
    ) -> list[StoredEvent]:
        """Events of ``job_id`` with version > ``after_version``, in version order."""
        ...

    def iter_events(
        self, job_id: str, *, batch: int = 1000, after_version: int = 0, limit: int | None = None
    ) -> Iterator[StoredEvent]:
        """The events :meth:`list_events` returns for the same ``after_version`` and ``limit``,
        fetched ``batch`` at a time (memory does not grow with the log)."""
        ...

    # API keys, and the counts the metrics show
    def get_api_key(self, key_id: str) -> ApiKeyRow | None: ...
    def list_api_keys(self) -> list[ApiKeyRow]: ...
    def count_jobs_by_status(self) -> dict[str, int]: ...
    def count_invocations_by_status(self) -> dict[str, int]: ...
    def count_claim_verdicts(self) -> dict[tuple[str, str], int]: ...

    def snapshot(self, *, lenient_text: bool = False) -> AbstractContextManager[Snapshot]:
        """A consistent read-only view; see :class:`Snapshot`. ``lenient_text``: text that is
        not UTF-8 (only SQLite can hold it: a column edited outside the store) is read with
        its bad bytes as lone surrogates instead of failing the read, so that a verifier can
        report the row; slower, for that case only."""
        ...

    def with_text_fallback(self, read: Callable[[bool], T]) -> T:
        """``read(False)``; when that read fails on stored text the database cannot decode —
        only SQLite can hold it: a column edited outside the store that is not UTF-8 —
        ``read(True)``, the same read again with ``lenient_text`` (see :meth:`snapshot`), so
        that a reader can report the row instead of failing. A backend that cannot hold such
        text answers ``read(False)`` alone.

        Raises:
            StoreError: whatever ``read`` raises otherwise.
        """
        ...

    def get_seal(self, job_id: str) -> Seal | None:
        """The job's seal, if it has one."""
        ...

    def get_seals(self, job_ids: Sequence[str]) -> dict[str, Seal]:
        """The seals of those of ``job_ids`` that have one, by job id (a few statements for
        any number of jobs: a join reads its children's seals at once)."""
        ...

    def signing_keys(self) -> list[PublicKey]:
        """Every public key recorded for checking seals (retired ones included)."""
        ...

    def clock_offset(self) -> ClockOffset | None:
        """How far the database server's clock is from this host's, for a database that other
        hosts' workers share (PostgreSQL); ``None`` where every worker runs on the database's
        own host (SQLite)."""
        ...

    def close(self) -> None: ...
