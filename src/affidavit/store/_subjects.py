"""Data subjects (tables ``subjects``, ``subject_keys``, ``job_subjects``, migration 24).

A job with a subject has the values a person or an agent supplies sealed under the subject's
data key (:mod:`affidavit.core.privacy`). The sealing that reaches every writer happens here, in
:meth:`SqlTransaction.append <affidavit.store._sql.SqlTransaction.append>`: whatever appends an
event of such a job (a run, a signal, an approval, a cancel), its values are sealed before they
are written. :class:`SubjectKeys` keeps, per store, the data keys of the jobs this process
writes (and which jobs have none), so that the check costs no query after a job's first write.

Mixed into :class:`~affidavit.store._sql.SqlTransaction`. SQL uses ``?`` placeholders.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.core.canonical import canonical, parse
from affidavit.core.events import utc_now
from affidavit.core.privacy import (
    SEALED_FIELDS,
    JobCipher,
    KeyProvider,
    SubjectError,
    data_key_id,
    master_key_provider,
    new_data_key,
    seal_payload,
)
from affidavit.store._types import Encoded

SUBJECTS_MIGRATION = 24
_KEY_OF_JOB = (
    "SELECT s.subject_id, k.wrapped_key FROM job_subjects s "
    "LEFT JOIN subject_keys k ON k.subject_id = s.subject_id WHERE s.job_id = ?"
)
_SEALED_TYPES = frozenset(SEALED_FIELDS) | {"job_waiting"}
_KEYS: dict[str, tuple[bytes, ...]] = {
    t: tuple(f'"{f}":'.encode() for f in (*SEALED_FIELDS.get(t, ()), "call", "decided_by"))
    for t in _SEALED_TYPES
}
_CACHE_LIMIT = 50_000


def _context(subject_id: str) -> bytes:
    return b"subject:" + subject_id.encode()


@dataclass(frozen=True)
class SubjectRow:
    """A subject as the store keeps it: never the subject itself, only its keyed hash."""

    subject_id: str
    key_id: str
    created_at: str
    erased_at: str | None
    erase_reason: str | None
    jobs: int
    first_used: str | None
    last_used: str | None


class SubjectKeys:
    """A store's key provider (set, or ``$AFFIDAVIT_MASTER_KEY`` on first need) and the data
    keys of the jobs this process writes. Only writers use the cache: a job's subject never
    changes, and a job is cancelled before its subject is erased (after which its writes are
    refused); readers look the key up each time."""

    def __init__(self, provider: KeyProvider | None = None) -> None:
        self._provider = provider
        self._ciphers: dict[str, JobCipher | None] = {}
        self._lock = threading.Lock()

    @property
    def provider(self) -> KeyProvider:
        """The key provider. Raises :class:`~affidavit.core.privacy.MasterKeyError` if none is
        configured."""
        if self._provider is None:
            self._provider = master_key_provider()
        return self._provider

    def use(self, provider: KeyProvider) -> None:
        """Use ``provider`` from now on."""
        with self._lock:
            self._provider = provider
            self._ciphers.clear()

    def forget(self, job_ids: Sequence[str]) -> None:
        """Drop the cached keys of ``job_ids`` (their subject was erased)."""
        with self._lock:
            for job_id in job_ids:
                self._ciphers.pop(job_id, None)

    def cached(self, job_id: str) -> tuple[bool, JobCipher | None]:
        found = self._ciphers.get(job_id, _MISSING)
        return (False, None) if found is _MISSING else (True, found)  # type: ignore[return-value]

    def remember(self, job_id: str, cipher: JobCipher | None) -> None:
        with self._lock:
            if len(self._ciphers) >= _CACHE_LIMIT:
                self._ciphers.clear()
            self._ciphers[job_id] = cipher

    def cipher(self, job_id: str, row: Any) -> JobCipher | None:
        """The cipher of ``job_id`` from its ``_KEY_OF_JOB`` row (``None``: no subject).

        Raises:
            SubjectError: the job's subject was erased.
        """
        if row is None:
            return None
        subject_id, wrapped = str(row[0]), row[1]
        if wrapped is None:
            raise SubjectError(
                f"job {job_id}'s subject was erased: its record can no longer be written",
                hint="Nothing more can be added to a job whose subject is erased.",
            )
        return JobCipher(job_id, self.provider.unwrap(bytes(wrapped), _context(subject_id)))


_MISSING = object()


class SubjectOps:
    """The subject statements of a transaction."""

    subjects: SubjectKeys | None = None  # set by the store on each transaction
    subject_tables = True
    FOR_UPDATE: str  # the backend's row-lock clause (empty on SQLite: its writers take turns)

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...

    def bind_subject(self, job_id: str, subject: str) -> str:
        """Make ``job_id`` (created in this transaction) a job of ``subject``, creating the
        subject's data key on first use; returns the subject's id (its keyed hash).

        Raises:
            SubjectError: the subject was erased.
            MasterKeyError: no master key is configured.
        """
        keys = self.subjects if self.subjects is not None else SubjectKeys()
        provider = keys.provider
        subject_id = provider.subject_id(subject)
        now = utc_now()
        # (the subject's row locked: an erasure that commits first is seen, never outrun)
        rows = self.query(
            "SELECT s.erased_at, k.wrapped_key FROM subjects s "
            "LEFT JOIN subject_keys k ON k.subject_id = s.subject_id WHERE s.subject_id = ?"
            + (" FOR UPDATE OF s" if self.FOR_UPDATE else ""),
            (subject_id,),
        )
        if rows and rows[0][0] is not None:
            raise SubjectError(
                f"subject {subject_id[:16]}… was erased at {rows[0][0]}",
                hint="A subject once erased takes no new jobs: its key is gone for good.",
            )
        if rows:
            data_key = provider.unwrap(bytes(rows[0][1]), _context(subject_id))
        else:
            data_key = new_data_key()
            self.execute(
                "INSERT INTO subjects (subject_id, key_id, wrapped_by, created_at) "
                "VALUES (?, ?, ?, ?)",
                (subject_id, data_key_id(data_key), provider.key_id, now),
            )
            self.execute(
                "INSERT INTO subject_keys (subject_id, wrapped_key) VALUES (?, ?)",
                (subject_id, provider.wrap(data_key, _context(subject_id))),
            )
        self.execute(
            "INSERT INTO job_subjects (job_id, subject_id, created_at) VALUES (?, ?, ?)",
            (job_id, subject_id, now),
        )
        keys.remember(job_id, JobCipher(job_id, data_key))
        return subject_id

    def job_cipher(self, job_id: str) -> JobCipher | None:
        """The cipher of ``job_id``'s subject (``None``: the job has none), for a writer.

        Raises:
            SubjectError: the job's subject was erased.
        """
        keys = self.subjects
        if keys is None or not self.subject_tables:
            return None
        known, cipher = keys.cached(job_id)
        if known:
            return cipher
        rows = self.query(_KEY_OF_JOB, (job_id,))
        cipher = keys.cipher(job_id, rows[0] if rows else None)
        keys.remember(job_id, cipher)
        return cipher

    def no_subject(self, job_id: str) -> None:
        """``job_id`` was created in this transaction without a subject (it can never have
        one: a subject is bound in its job's creating transaction), so its writers need not
        look its key up. Kept even if the transaction fails: no job has the id then, and one
        created with it later with a subject is remembered again by :meth:`bind_subject`."""
        keys = self.subjects
        if keys is not None:
            keys.remember(job_id, None)

    def sealed_rows(self, job_id: str, rows: Sequence[Encoded]) -> Sequence[Encoded]:
        """``rows`` with the values of a subject's job sealed (see the module docstring)."""
        if not rows:
            return rows
        cipher = self.job_cipher(job_id)
        if cipher is None:
            return rows
        out: list[Encoded] = []
        for event_id, event_type, data in rows:
            # (JCS writes a member as "name": an event naming none of its type's sealed fields
            # has nothing to seal, and is not parsed)
            if event_type in _SEALED_TYPES and any(k in data for k in _KEYS[event_type]):
                payload = parse(data)
                if isinstance(payload, dict) and seal_payload(cipher, event_type, payload):
                    data = canonical(payload)
            out.append((event_id, event_type, data))
        return out

    def sealed_column(self, job_id: str, value: Any) -> Any:
        """``value`` (a job's output or error as its row keeps it) sealed like its event."""
        if value is None:
            return None
        cipher = self.job_cipher(job_id)
        return value if cipher is None else cipher.seal(value)

    def lock_subject(self, subject_id: str) -> tuple[str | None, str | None] | None:
        """Lock the subject's row for the rest of the transaction; ``(erased_at, receipt)``, or
        ``None`` for no such subject."""
        rows = self.query(
            f"SELECT erased_at, receipt FROM subjects WHERE subject_id = ?{self.FOR_UPDATE}",
            (subject_id,),
        )
        if not rows:
            return None
        return (
            None if rows[0][0] is None else str(rows[0][0]),
            None if rows[0][1] is None else str(rows[0][1]),
        )

    def subject_jobs_locked(self, subject_id: str) -> list[tuple[str, str]]:
        """``(job_id, status)`` of each of the subject's jobs, oldest first, their rows locked
        (a job that is not finished cannot end or be claimed meanwhile)."""
        lock = " FOR UPDATE OF j" if self.FOR_UPDATE else ""
        rows = self.query(
            "SELECT j.job_id, j.status FROM job_subjects s JOIN jobs j ON j.job_id = s.job_id "
            f"WHERE s.subject_id = ? ORDER BY s.created_at, s.job_id{lock}",
            (subject_id,),
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    def subject_key_id(self, subject_id: str) -> str | None:
        rows = self.query("SELECT key_id FROM subjects WHERE subject_id = ?", (subject_id,))
        return str(rows[0][0]) if rows else None

    def erase_subject(
        self, subject_id: str, *, at: str, reason: str | None, receipt: str, leaf: bytes
    ) -> None:
        """Delete the subject's data key, mark it erased with its signed ``receipt``, and
        queue ``leaf`` (the receipt's transparency-log leaf), all in this transaction; the
        caller locked the subject (:meth:`lock_subject`) and checked its jobs."""
        self.execute("DELETE FROM subject_keys WHERE subject_id = ?", (subject_id,))
        self.execute(
            "UPDATE subjects SET erased_at = ?, erase_reason = ?, receipt = ? WHERE subject_id = ?",
            (at, reason, receipt, subject_id),
        )
        self.execute(
            "INSERT INTO tlog_queue (job_id, leaf, queued_at) VALUES (?, ?, ?)",
            (f"{ERASURE_RECORD_PREFIX}{subject_id}", leaf, time.time()),
        )
        if self.subjects is not None:
            self.subjects.forget([job_id for job_id, _ in self.subject_jobs_locked(subject_id)])


ERASURE_RECORD_PREFIX = "erasure:"  # a receipt's record id in the transparency log


SUBJECT_LIST = (
    "SELECT s.subject_id, s.key_id, s.created_at, s.erased_at, s.erase_reason, "
    "count(j.job_id), min(j.created_at), max(j.created_at) FROM subjects s "
    "LEFT JOIN job_subjects j ON j.subject_id = s.subject_id "
)
# after the subject whose id is the parameter (given three times), in SUBJECT_GROUP's order
SUBJECT_AFTER = (
    "(s.created_at > (SELECT created_at FROM subjects WHERE subject_id = ?) OR "
    "(s.created_at = (SELECT created_at FROM subjects WHERE subject_id = ?) AND "
    "s.subject_id > ?))"
)
SUBJECT_GROUP = (
    " GROUP BY s.subject_id, s.key_id, s.created_at, s.erased_at, s.erase_reason "
    "ORDER BY s.created_at, s.subject_id"
)


def subject_row(row: Sequence[Any]) -> SubjectRow:
    return SubjectRow(
        subject_id=str(row[0]),
        key_id=str(row[1]),
        created_at=str(row[2]),
        erased_at=None if row[3] is None else str(row[3]),
        erase_reason=None if row[4] is None else str(row[4]),
        jobs=int(row[5]),
        first_used=None if row[6] is None else str(row[6]),
        last_used=None if row[7] is None else str(row[7]),
    )
