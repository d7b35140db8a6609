"""The storage contract shared by both backends.

A :class:`Store` holds jobs and their append-only, hash-chained event logs (and, as later layers
land, the invocation ledger, seals, claims and trust) in one database, so that one transaction can
write events and ledger rows together. Backends: :mod:`affidavit.store.sqlite` and
:mod:`affidavit.store.postgres`, chosen by URL in :func:`affidavit.store.open_store`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from affidavit.core.canonical import parse
from affidavit.core.errors import UnreadableEventError
from affidavit.store._trust import TrustTransaction

if TYPE_CHECKING:
    from affidavit.core.merkle import Node
    from affidavit.core.seal import PublicKey, Seal
    from affidavit.store._limits import GrantTaken, LimitUsage
    from affidavit.store._sealkeys import SealKeyAdmission
    from affidavit.store._tlog import LogLeaf, QueuedLeaf, RejectedLeaf, TlogState
    from affidavit.store.migrations import Migration

T = TypeVar("T")

JobStatus = Literal["pending", "running", "waiting", "parked", "completed", "failed", "cancelled"]
JOB_STATUSES: tuple[str, ...] = (
    "pending",
    "running",
    "waiting",
    "parked",
    "completed",
    "failed",
    "cancelled",
)
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. ``payload`` is canonicalized once, at append."""

    type: str
    payload: Mapping[str, Any]
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One row of a job's log. ``payload_bytes`` are exactly JCS(payload)."""

    job_id: str
    version: int
    event_id: str
    type: str
    payload_bytes: bytes
    chain_hash: str
    recorded_at: str | None = None

    @property
    def payload(self) -> Any:
        """The payload, decoded.

        Raises:
            UnreadableEventError: the stored payload is not JSON (the row was edited outside
                the store).
        """
        try:
            return parse(self.payload_bytes)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deeply
            raise UnreadableEventError(
                self.job_id, self.version, "the stored payload is not JSON"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """The event as FORMATS.md §9 prints it (payload decoded).

        Raises:
            UnreadableEventError: the stored payload is not JSON.
        """
        return {
            "version": self.version,
            "event_id": self.event_id,
            "type": self.type,
            "payload": self.payload,
            "chain_hash": self.chain_hash,
        }


def event_row_problem(row: Sequence[Any]) -> str:
    """What is wrong with the types of an event row ``(job_id, version, event_id, type,
    payload, chain_hash, ...)`` as read from either backend (``""``: nothing). Only a row edited
    outside the store has one: SQLite keeps whatever a column is given (`UPDATE events SET
    payload = '...'` in the sqlite3 shell stores text)."""
    fields = (("version", int), ("event id", str), ("type", str), ("chain hash", str))
    for (name, kind), value in zip(fields, (row[1], row[2], row[3], row[5]), strict=True):
        if type(value) is not kind:
            stored = "bytes" if isinstance(value, bytes | memoryview) else type(value).__name__
            return (
                f"the {name} is stored as {stored}, not {'an integer' if kind is int else 'text'}"
            )
    if not isinstance(row[4], bytes | bytearray | memoryview):
        stored = "text" if isinstance(row[4], str) else type(row[4]).__name__
        return f"the payload is stored as {stored}, not bytes"
    return ""


def checked_event(row: Sequence[Any], recorded_at: str | None = None) -> StoredEvent:
    """The event of a row ``(job_id, version, event_id, type, payload, chain_hash)``.

    Raises:
        UnreadableEventError: a field of the row is of another type than the store writes.
    """
    problem = event_row_problem(row)
    if problem:
        version = row[1] if type(row[1]) is int else 0
        raise UnreadableEventError(str(row[0]), version, problem)
    return StoredEvent(row[0], row[1], row[2], row[3], bytes(row[4]), row[5], recorded_at)


# An event already encoded for :meth:`Transaction.append_encoded`: (event_id, type, canonical
# payload bytes).
Encoded = tuple[str, str, bytes]

# A ledger row as :meth:`Snapshot.iter_ledger_columns` reads it: (idempotency_key, status,
# invocation_id, result text, node_id, step_id, tool_name, args_hash).
LedgerColumns = tuple[str, str, str, str, str, str, str, str]


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One ledger record: the fate of one tool invocation, keyed by (job, idempotency key)."""

    job_id: str
    idempotency_key: str
    node_id: str
    step_id: str
    tool_name: str
    args_hash: str
    status: str  # started | committed | failed
    invocation_id: str
    attempt_id: str | None
    tries: int
    result: Any
    error: Any


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A person's request to cancel a job whose tool call was in flight (see
    :mod:`affidavit.runtime._cancel`): who asked, when and why."""

    job_id: str
    requested_at: str
    reason: str | None
    by: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"requested_at": self.requested_at, "reason": self.reason, "by": self.by}


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job :meth:`Transaction.claim` took. ``recovered``: its lease had expired with an owner
    (the run before neither finished nor handed it back: killed, out of memory, exited inside
    a step, frozen). Then ``recoveries`` and ``progress`` are what the runs before recorded
    (see :meth:`Transaction.set_recoveries`); for any other claim they start again (0, None).
    ``log``: the job's whole log, read after the claim took the job, in its transaction, when
    the claim was asked for it (``with_log``) and the backend reads it in the claim's round
    trip (PostgreSQL); else ``None``, and the claimer reads the log itself."""

    job_id: str
    recovered: bool = False
    recoveries: int = 0
    progress: int | None = None
    log: tuple[StoredEvent, ...] | None = None


@dataclass(slots=True)
class NextClaim:
    """A claim to make right after a transaction commits, in a transaction of its own, as
    :meth:`Store.claim` makes one (see :meth:`Transaction.claim_after_commit`): a worker's
    next claim, carried by the transaction that ends its current job.

    The transaction fills in the outcome: ``made`` once the claim ran and committed, with the
    job it took in ``claimed`` (``None``: nothing was runnable). ``sent`` once a transaction
    sent it, whatever came of it: a transaction tried again does not send it a second time.
    Not ``made`` means nothing is known of it: the claimer claims the usual way."""

    owner: str
    attempt_id: str
    now: float
    lease_seconds: float
    skip: Collection[str] = ()
    with_log: bool = False
    sent: bool = False
    made: bool = False
    claimed: Claimed | None = None


@dataclass(frozen=True, slots=True)
class ApiKeyRow:
    """One API key of the HTTP API (only a SHA-256 of its secret is stored)."""

    key_id: str
    agent_id: str
    role: str
    namespace: str
    key_hash: str
    created_at: str
    revoked_at: str | None

    def to_dict(self) -> dict[str, Any]:
        """The key as listed (never with its hash)."""
        return {
            "key_id": self.key_id,
            "agent_id": self.agent_id,
            "role": self.role,
            "namespace": self.namespace,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
        }


def unmatchable(text: str) -> bool:
    """Whether no stored text can equal ``text``, so a query for it needs no database: it
    holds a NUL (PostgreSQL refuses it in a query) or a lone surrogate (not Unicode text —
    a byte that is not UTF-8 on the command line — which no driver can send)."""
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


UNREADABLE_HINT = (
    "the stored {column} is not JSON: the job row was changed outside affidavit; "
    "`affidavit verify {job_id}` checks the job's record"
)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job row. ``version`` and ``head_hash`` are the head of its event chain.
    ``unreadable`` names the columns among ``output`` and ``error`` whose stored text is not
    JSON (a row changed outside the store): each is read as ``None``."""

    job_id: str
    namespace: str
    status: str
    plan_name: str | None
    idempotency_key: str | None
    submitted_by: str | None
    created_at: str
    updated_at: str
    version: int
    head_hash: str | None
    attempt_id: str | None = None
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    output: Any = None
    error: Any = None
    unreadable: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "namespace": self.namespace,
            "status": self.status,
            "plan_name": self.plan_name,
            "idempotency_key": self.idempotency_key,
            "submitted_by": self.submitted_by,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "event_count": self.version,
            "head_hash": self.head_hash,
            "attempt_id": self.attempt_id,
            "lease_owner": self.lease_owner,
            "lease_expires_at": self.lease_expires_at,
            "output": self.output,
            "error": self.error,
            **self.unreadable_doc(),
        }

    def unreadable_doc(self) -> dict[str, Any]:
        """``{"unreadable": {column: why}}`` for the columns in :attr:`unreadable`; ``{}`` for
        a sound row (whose documents are unchanged)."""
        if not self.unreadable:
            return {}
        return {
            "unreadable": {
                column: UNREADABLE_HINT.format(column=column, job_id=self.job_id)
                for column in self.unreadable
            }
        }


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Filters for :meth:`Store.list_jobs`; ``None`` means "any"."""

    status: Sequence[str] | None = None
    namespace: str | None = None
    plan_name: str | None = None
    limit: int = 100
    offset: int = 0
    # A keyset cursor: only the jobs listed after this job (a job id; newest first), so the
    # next page after a page ending with job X is ``before=X`` — cheap at any depth, and
    # stable while new jobs arrive (an offset shifts by one per new job).
    before: str | None = None


class TlogReader(Protocol):
    """Reads of the transparency log of seals (see affidavit.store._tlog)."""

    def tlog_state(self) -> TlogState: ...

    def tlog_nodes(self, nodes: Iterable[Node]) -> dict[Node, bytes]: ...

    def tlog_node_range(self, level: int, start: int, count: int) -> list[bytes]: ...

    def tlog_leaf_of(self, job_id: str) -> LogLeaf | None: ...

    def tlog_leaves_of(self, job_id: str, limit: int) -> list[LogLeaf]: ...

    def tlog_first_indices(self, job_ids: Iterable[str]) -> dict[str, int]: ...

    def tlog_rejected(self, limit: int) -> list[RejectedLeaf]: ...

    def tlog_first_cosigned_sizes(self, min_size: int, limit: int) -> list[int]: ...

    def tlog_leaves(self, start: int, end: int) -> list[LogLeaf]: ...

    def tlog_queued_for(self, job_id: str) -> bool: ...

    def tlog_queue_length(self) -> int: ...

    def tlog_checkpoint(self, size: int | None = None) -> tuple[int, str] | None: ...

    def tlog_cosigned_sizes(self, min_size: int) -> list[int]: ...

    def tlog_cosignatures(self, size: int) -> list[str]: ...


class TlogWriter(TlogReader, Protocol):
    """Writes of the transparency log of seals (see affidavit.store._tlog)."""

    def tlog_take_lease(self, owner: str, now: float, until: float) -> bool: ...

    def tlog_release_lease(self, owner: str) -> None: ...

    def tlog_set_origin(self, origin: str) -> None: ...

    def tlog_queue_batch(self, limit: int) -> list[QueuedLeaf]: ...

    def tlog_commit_batch(
        self,
        *,
        owner: str,
        old_size: int,
        batch: Sequence[QueuedLeaf],
        nodes: dict[Node, bytes],
        checkpoint: str,
        now: float,
        created_at: str,
    ) -> bool: ...

    def tlog_reject(
        self, rejected: Sequence[tuple[QueuedLeaf, str, int | None]], now: float
    ) -> None: ...

    def tlog_store_checkpoint(self, size: int, note: str, created_at: str) -> None: ...

    def tlog_add_cosignature(
        self, size: int, name: str, key_id: str, line: str, added_at: str
    ) -> bool: ...


class Transaction(TlogWriter, TrustTransaction, Protocol):
    """Writes that commit or roll back together. Obtained from :meth:`Store.transaction`."""

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int,
        fence: str | None = None,
    ) -> list[StoredEvent]:
        """Append ``events`` to ``job_id``'s log, chained from its head.

        Raises:
            JobNotFound: no such job.
            FencedError: ``fence`` is given and is not the job's current attempt id.
            ConflictError: ``expected_version`` is not the job's current version.
            CanonicalizationError: a payload is not representable (nothing is written).
        """
        ...

    def append_encoded(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        *,
        expected_version: int,
        fence: str | None = None,
        head: bytes | None = None,
    ) -> list[StoredEvent]:
        """:meth:`append` for events already encoded as ``(event_id, type, JCS payload bytes)``
        (the caller guarantees the bytes are canonical and the type and id well-formed).

        ``head``, the raw chain hash of event ``expected_version`` (``b""`` when it is 0), is for
        a writer that knows it because it wrote that event: the append is refused exactly as
        without it, but the head need not be read back.

        Raises:
            JobNotFound, FencedError, ConflictError: as :meth:`append`.
        """
        ...

    def append_known_head(
        self,
        job_id: str,
        encoded: Sequence[Encoded],
        *,
        expected_version: int,
        fence: str | None,
        head: bytes,
    ) -> list[bytes]:
        """:meth:`append_encoded` with ``head`` (a writer that knows it), returning only the new
        events' raw chain hashes, in order (the last is the new head; none for no events) —
        what a run keeps of an append.

        Raises:
            JobNotFound, FencedError, ConflictError: as :meth:`append`.
        """
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

    def set_lease(
        self, job_id: str, *, attempt_id: str | None, owner: str | None, expires_at: float | None
    ) -> None:
        """Give the job's lease to a new attempt (or clear it). Later fenced writes must carry
        ``attempt_id``."""
        ...

    # The invocation ledger (one row per (job, idempotency key): the fate of one tool
    # invocation) and the job leases.

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

    # Cancel requests (see affidavit.store._cancels).

    def cancel_request(self, job_id: str) -> CancelRequest | None:
        """The cancel request in force for ``job_id``, if one was recorded."""
        ...

    def request_cancel(
        self, job_id: str, *, at: str, reason: str | None, by: str | None
    ) -> CancelRequest:
        """Record a cancel request for ``job_id`` (its row locked by the caller, see
        :meth:`get_job`): from then on the store refuses to start a new invocation of the job
        (:class:`~affidavit.core.errors.CancelRequestedError`), to complete it or to make it
        wait. The first request stays in force, and is returned, when there is one already."""
        ...

    # Tool and model limits (see affidavit.store._limits).

    def limit_take(
        self,
        name: str,
        *,
        grant_id: str,
        job_id: str,
        attempt_id: str,
        clock: Callable[[], int],
        rate: tuple[int, int] | None,
        concurrency: int | None,
    ) -> GrantTaken:
        """Take a grant of limit ``name`` for the claim ``attempt_id`` if its rate (count,
        period in µs) and concurrency allow it now, exactly across concurrent takers; else
        write nothing and say how long to wait."""
        ...

    def limit_release(self, grant_id: str, *, at_us: int) -> None:
        """End a grant: its call is over."""
        ...

    def limit_usage(self, *, now_us: int) -> list[LimitUsage]:
        """Every limit's use at ``now_us``: grants in flight, and started in its window."""
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
        """Claim one runnable job — pending, or running with an expired lease — for a new
        attempt; ``None`` if there is none. Concurrent claimers never get the same job.
        ``skip``: jobs not to claim. A job whose lease expired with an owner is ``recovered``
        (see :class:`Claimed`). ``with_log``: read the job's log with the claim where that
        costs no round trip of its own (see :attr:`Claimed.log`)."""
        ...

    def claim_after_commit(self, request: NextClaim) -> None:
        """Make ``request``'s claim once this transaction has committed, in a transaction of
        its own, where that costs no round trip of its own (PostgreSQL: it travels in the
        commit's message, after the commit, and runs only if the commit did); elsewhere, and
        when ``request`` was sent already, nothing is done. What came of it is in ``request``
        after the commit (see :class:`NextClaim`). A claim that fails leaves this
        transaction's commit as it was; a commit that fails leaves the claim unmade."""
        ...

    def heartbeat(self, job_id: str, attempt_id: str, expires_at: float) -> bool:
        """Extend the lease if ``attempt_id`` still holds it; ``False`` if it was lost."""
        ...

    def set_recoveries(self, job_id: str, attempt_id: str, count: int, progress: int) -> None:
        """Record, fenced by ``attempt_id``, that this claim is the ``count``-th recovery in a
        row of the job, at ``progress`` (see :class:`Claimed`)."""
        ...

    def release_lease(
        self,
        job_id: str,
        attempt_id: str,
        at: float,
        *,
        keep_owner: bool = False,
        untouched: bool = False,
    ) -> bool:
        """Give ``attempt_id``'s lease back (it expires at ``at``, no owner unless
        ``keep_owner``; ``untouched`` without ``keep_owner``: the job is ``pending`` again);
        ``False`` if the attempt no longer holds it."""
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


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """The database server's clock minus this host's, in seconds, known within ±
    ``uncertainty`` (half the round trip it was read in)."""

    offset: float
    uncertainty: float


class Store(Protocol):
    """One database holding jobs and their hash-chained event logs."""

    url: str
    backend: str

    def migrate(self, on_apply: Callable[[Migration], None] | None = None) -> list[int]:
        """Apply pending numbered migrations; return the versions applied (empty if none).
        ``on_apply`` is called with each migration before it is applied (progress for a long
        one, such as a table rebuild)."""
        ...

    def schema_version(self) -> int: ...

    def transaction(self, *, durable: bool = True) -> AbstractContextManager[Transaction]:
        """A write transaction. ``durable=True`` returns only after the commit is synced to
        disk; ``durable=False`` only writes it (the next durable commit covers it)."""
        ...

    def append(
        self,
        job_id: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int,
        fence: str | None = None,
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
    ) -> tuple[JobRecord, bool]:
        """Create a job and append its first ``events`` atomically; with an idempotency key
        already used in the namespace, return the existing job (and ``False``), writing nothing."""
        ...

    def get_job(self, job_id: str) -> JobRecord:
        """Raises :class:`JobNotFound`."""
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

    def signing_keys(self) -> list[PublicKey]:
        """Every public key recorded for checking seals (retired ones included)."""
        ...

    def clock_offset(self) -> ClockOffset | None:
        """How far the database server's clock is from this host's, for a database that other
        hosts' workers share (PostgreSQL); ``None`` where every worker runs on the database's
        own host (SQLite)."""
        ...

    def close(self) -> None: ...
