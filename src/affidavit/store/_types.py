"""The values of the storage contract: statuses, events, ledger rows, jobs, claims and the
filters of a listing (the protocols that use them: :mod:`affidavit.store.base`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from affidavit.core.canonical import parse
from affidavit.core.errors import UnreadableEventError

if TYPE_CHECKING:
    from affidavit.store.queues import Placement

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
class NewJob:
    """A job to create with its first ``events`` (see :meth:`Store.create_jobs`; the fields
    are :meth:`Store.create_job`'s arguments)."""

    namespace: str = "default"
    plan_name: str | None = None
    idempotency_key: str | None = None
    submitted_by: str | None = None
    events: Sequence[NewEvent] = ()
    placement: Placement | None = None
    parent: tuple[str, str] | None = None
    tags: Mapping[str, str] | None = None
    subject: str | None = None
    job_id: str | None = None


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
        """The event as docs/formats.md §9 prints it (payload decoded).

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


# An event already encoded for :meth:`Transaction.append` (``encoded=``): (event_id, type, canonical
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
    parent: str | None = None  # only the child jobs of this job (ctx.start_job)
    # only the jobs with every one of these tags (key, value): AND (see store/tags.py)
    tags: Sequence[tuple[str, str]] = ()
    limit: int = 100
    offset: int = 0
    # A keyset cursor: only the jobs listed after this job (a job id; newest first), so the
    # next page after a page ending with job X is ``before=X`` — cheap at any depth, and
    # stable while new jobs arrive (an offset shifts by one per new job).
    before: str | None = None


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """The database server's clock minus this host's, in seconds, known within ±
    ``uncertainty`` (half the round trip it was read in)."""

    offset: float
    uncertainty: float
