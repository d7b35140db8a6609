"""Erasing a data subject: the service behind ``affidavit erase`` (and ``affidavit subjects``).

A job of the subject that is not finished is cancelled first, when the face gives the erasure
a way to (``cancel``: the runtime's cancel, by its rules — a job with a tool call in flight
finishes that call and records its real outcome, then ends cancelled): the erasure goes on once
every job has ended, and is refused, with the cancels requested, while one has not.

The erasure is one transaction: the subject's row locked (a job submitted for it meanwhile
waits, then sees it erased), its jobs checked (every one finished, else nothing changes), its
data key's row deleted, the subject marked erased with its signed receipt, and the receipt's
leaf queued for the transparency log. After the commit the backend removes the copies its files
may keep of the deleted row (:meth:`Store.scrub_erased`). Erasing an erased subject again does
that scrub again and returns the receipt it has: a process killed at any point is finished by
running the same command again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from affidavit.core import crash
from affidavit.core.canonical import canonical, parse
from affidavit.core.errors import JobNotFound
from affidavit.core.events import utc_now
from affidavit.core.privacy import SubjectBusy, SubjectError, SubjectNotFound, check_subject
from affidavit.privacy._receipt import MAX_REASON, RECORD_PREFIX, log_leaf, sign_receipt
from affidavit.record import Sealer
from affidavit.store import Store, SubjectRow
from affidavit.tlog import LogError, NotInLog, TransparencyLog

_FINISHED = frozenset({"completed", "failed", "cancelled"})
#: A job's cancel, as an erasure asks for it: ``"cancelled"`` (ended now), ``"requested"`` (it
#: ends cancelled once its tool call in flight is resolved) or ``"ended"`` (it had finished).
Cancel = Callable[[str], str]


@dataclass(frozen=True)
class Erasure:
    """What an erasure did: its receipt document, whether this call erased (``False``: the
    subject was erased before, and its receipt is returned again), and whether the store's
    files could be scrubbed of the deleted key (see :meth:`Store.scrub_erased`)."""

    receipt: dict[str, Any]
    erased_now: bool
    scrubbed: bool
    cancelled: list[str] = field(default_factory=list)  # the jobs this erasure cancelled first

    def to_dict(self) -> dict[str, Any]:
        """What ``erase --json`` prints and ``POST /api/subjects/{subject}/erase`` answers."""
        return {
            "receipt": self.receipt,
            "erased_now": self.erased_now,
            "scrubbed": self.scrubbed,
            "cancelled": self.cancelled,
        }


def subject_id(store: Store, subject: str) -> str:
    """The id the store keeps ``subject`` under (its keyed hash).

    Raises:
        SubjectError: a malformed subject.
        MasterKeyError: no master key is configured.
    """
    return store.subjects.provider.subject_id(check_subject(subject))


def check_reason(reason: str | None) -> None:
    """Raises :class:`SubjectError` for a reason that is not short plain text."""
    if reason is None:
        return
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise SubjectError(f"the reason is not text of at most {MAX_REASON} characters")
    if any((ord(c) < 0x20 and c not in "\t") or ord(c) == 0x7F for c in reason):
        raise SubjectError("the reason contains a control character")


def erase(
    store: Store,
    subject: str,
    *,
    sealer: Sealer,
    reason: str | None = None,
    cancel: Cancel | None = None,
) -> Erasure:
    """Erase ``subject``: its data key is destroyed, so the values its jobs' records hold
    sealed can never be read again, while every record still verifies; returns the signed
    receipt (see the module docstring). ``cancel``: how to cancel a job of the subject that
    is not finished, first (``None``: such a job refuses the erasure).

    Raises:
        SubjectError: a malformed subject or reason.
        SubjectNotFound: no job was ever submitted for it.
        SubjectBusy: one of its jobs is not finished (nothing is erased: without ``cancel``
            nothing is changed; with it, its cancel is requested — it ends cancelled once its
            tool call in flight is resolved: erase again then).
        MasterKeyError: no master key is configured.
        SigningKeyError, SealKeyRefused: the receipt cannot be signed.
    """
    check_reason(reason)
    sid = subject_id(store, subject)
    key = sealer.admit(store)
    cancelled, requested = _cancel_unfinished(store, sid, cancel) if cancel else ([], [])
    with store.transaction(durable=True) as tx:
        locked = tx.lock_subject(sid)
        if locked is None:
            raise SubjectNotFound("no job was ever submitted for this subject in this store")
        erased_at, stored = locked
        if erased_at is not None and stored is not None:
            receipt, erased_now = parse(stored), False
        else:
            jobs = tx.subject_jobs_locked(sid)
            running = [job_id for job_id, status in jobs if status not in _FINISHED]
            if running:
                raise _busy(running, requested)
            at = utc_now()
            body = {
                "subject_id": sid,
                "data_key_id": tx.subject_key_id(sid),
                "erased_at": at,
                "job_ids": [job_id for job_id, _ in jobs],
                "reason": reason,
                "key_id": key.key_id,
            }
            receipt, erased_now = sign_receipt(key, body), True
            tx.erase_subject(
                sid,
                at=at,
                reason=reason,
                receipt=canonical(receipt).decode(),
                leaf=log_leaf(body),
            )
            crash.crash_point("erase.before_commit")
    crash.crash_point("erase.after_commit")
    scrubbed = store.scrub_erased()
    return Erasure(with_log_proof(store, receipt), erased_now, scrubbed, cancelled)


def _cancel_unfinished(store: Store, sid: str, cancel: Cancel) -> tuple[list[str], list[str]]:
    """Cancel the subject's jobs that are not finished (none once it is erased): the jobs
    cancelled now, and those whose cancel waits for a tool call in flight."""
    with store.transaction(durable=False) as tx:
        locked = tx.lock_subject(sid)
        if locked is None or locked[0] is not None:
            return [], []
        jobs = [job_id for job_id, status in tx.subject_jobs_locked(sid) if status not in _FINISHED]
    cancelled: list[str] = []
    requested: list[str] = []
    for job_id in jobs:
        state = cancel(job_id)  # ("ended": it finished meanwhile, by itself)
        if state in ("cancelled", "requested"):
            (cancelled if state == "cancelled" else requested).append(job_id)
    return cancelled, requested


def _busy(running: list[str], requested: list[str]) -> SubjectBusy:
    listed = ", ".join(running[:5]) + (" …" if len(running) > 5 else "")
    if requested:
        return SubjectBusy(
            f"{len(running)} job(s) of the subject are not finished: {listed}; their cancel is "
            "requested: each ends cancelled once its tool call in flight is resolved",
            hint="Erase again once they have ended (`affidavit jobs show JOB`): a job still "
            "running would need the values the key opens.",
        )
    return SubjectBusy(
        f"{len(running)} job(s) of the subject are not finished: {listed}",
        hint="Cancel them (`affidavit cancel JOB`) or let them end, then erase: "
        "a job still running would need the values the key opens.",
    )


def with_log_proof(store: Store, receipt: dict[str, Any]) -> dict[str, Any]:
    """``receipt`` with its tlog-proof, once the log has integrated its leaf."""
    record = RECORD_PREFIX + str(receipt["receipt"]["subject_id"])
    try:
        proof = TransparencyLog(store).job_proof(record).encode()
    except (LogError, NotInLog, JobNotFound):
        proof = None
    return {**receipt, "tlog_proof": proof}


def stored_receipt(store: Store, subject: str) -> dict[str, Any]:
    """The receipt of an erased ``subject``, with its tlog-proof when the log has it.

    Raises:
        SubjectError: no such subject, or it is not erased.
    """
    sid = subject_id(store, subject)
    with store.transaction(durable=False) as tx:
        locked = tx.lock_subject(sid)
    if locked is None or locked[1] is None:
        raise SubjectError("the subject is not erased in this store")
    return with_log_proof(store, parse(locked[1]))


def find_subject(store: Store, subject: str) -> SubjectRow:
    """The subject's row (its jobs, first and last use, erasure).

    Raises:
        SubjectError: a malformed subject.
        SubjectNotFound: no job was ever submitted for it.
        MasterKeyError: no master key is configured.
    """
    sid = subject_id(store, subject)
    rows = store.list_subjects(sid)
    if not rows:
        raise SubjectNotFound("no job was ever submitted for this subject in this store")
    return rows[0]
