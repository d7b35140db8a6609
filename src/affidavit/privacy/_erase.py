"""Erasing a data subject: the service behind ``affidavit erase`` (and ``affidavit subjects``).

The erasure is one transaction: the subject's row locked (a job submitted for it meanwhile
waits, then sees it erased), its jobs checked (every one finished, else nothing changes), its
data key's row deleted, the subject marked erased with its signed receipt, and the receipt's
leaf queued for the transparency log. After the commit the backend removes the copies its files
may keep of the deleted row (:meth:`Store.scrub_erased`). Erasing an erased subject again does
that scrub again and returns the receipt it has: a process killed at any point is finished by
running the same command again.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Erasure:
    """What an erasure did: its receipt document, whether this call erased (``False``: the
    subject was erased before, and its receipt is returned again), and whether the store's
    files could be scrubbed of the deleted key (see :meth:`Store.scrub_erased`)."""

    receipt: dict[str, Any]
    erased_now: bool
    scrubbed: bool

    def to_dict(self) -> dict[str, Any]:
        """What ``erase --json`` prints and ``POST /api/subjects/{subject}/erase`` answers."""
        return {"receipt": self.receipt, "erased_now": self.erased_now, "scrubbed": self.scrubbed}


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


def erase(store: Store, subject: str, *, sealer: Sealer, reason: str | None = None) -> Erasure:
    """Erase ``subject``: its data key is destroyed, so the values its jobs' records hold
    sealed can never be read again, while every record still verifies; returns the signed
    receipt (see the module docstring).

    Raises:
        SubjectError: a malformed subject or reason.
        SubjectNotFound: no job was ever submitted for it.
        SubjectBusy: one of its jobs is not finished (nothing is changed: cancel it, or wait
            for its end).
        MasterKeyError: no master key is configured.
        SigningKeyError, SealKeyRefused: the receipt cannot be signed.
    """
    check_reason(reason)
    sid = subject_id(store, subject)
    key = sealer.admit(store)
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
                raise SubjectBusy(
                    f"{len(running)} job(s) of the subject are not finished: "
                    + ", ".join(running[:5])
                    + (" …" if len(running) > 5 else ""),
                    hint="Cancel them (`affidavit cancel JOB`) or let them end, then erase: "
                    "a job still running would need the values the key opens.",
                )
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
    return Erasure(with_log_proof(store, receipt), erased_now, scrubbed)


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
