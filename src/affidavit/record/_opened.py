"""A subject's event as a reader sees it: its sealed values opened while the subject's key
exists, shown as erased after (docs/privacy.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.privacy import (
    ERASED,
    JobCipher,
    SealedValueError,
    erased_opener,
    is_sealed,
    open_payload,
)
from affidavit.store import JobRecord, Store, StoredEvent


def opened_payload(event: StoredEvent, cipher: JobCipher | None) -> Any:
    """``event``'s payload with its sealed values opened under ``cipher`` (a subject's job),
    or shown as :data:`~affidavit.core.privacy.ERASED` when ``cipher`` is ``None``.

    Raises:
        SealedValueError: a sealed value does not open under ``cipher``.
    """
    payload = event.payload
    if not isinstance(payload, dict):
        return payload
    opener = erased_opener if cipher is None else cipher.open
    return open_payload(opener, event.type, payload)


UNOPENED = "[sealed value that does not open]"


class SubjectView:
    """How a reader (CLI, API, trace page) shows one job: a subject's sealed values opened
    while its key exists and :data:`~affidavit.core.privacy.ERASED` after — never failing on
    them (a value that does not open, changed outside affidavit, shows as :data:`UNOPENED`;
    ``affidavit verify`` is what judges the record). Other jobs are shown as they are. The key
    is read once, when the view is made."""

    def __init__(self, store: Store, job_id: str) -> None:
        key = store.job_key(job_id)
        self.subject = key is not None
        self.cipher = key[1] if key is not None else None

    def value(self, value: Any) -> Any:
        """``value`` as shown: opened, or erased."""
        if not is_sealed(value):
            return value
        if self.cipher is None:
            return ERASED
        try:
            return self.cipher.open(value)
        except SealedValueError:
            return UNOPENED

    def payload(self, event: StoredEvent) -> Any:
        """The event's payload as shown."""
        payload = event.payload
        if not self.subject or not isinstance(payload, dict):
            return payload
        return open_payload(self.value, event.type, payload)

    def event_dict(self, event: StoredEvent) -> dict[str, Any]:
        """:meth:`StoredEvent.to_dict` with the payload as shown."""
        doc = event.to_dict()
        if self.subject:
            doc["payload"] = self.payload(event)
        return doc

    def events(self, events: Sequence[StoredEvent]) -> list[StoredEvent]:
        """``events`` with their payloads as shown: for building what a person reads (a
        trace), never for a check — their chain hashes no longer cover their bytes."""
        if not self.subject:
            return list(events)
        return [replace(e, payload_bytes=canonical(self.payload(e))) for e in events]

    def job(self, job: JobRecord) -> JobRecord:
        """``job`` with its output and error as shown."""
        if not self.subject:
            return job
        return replace(job, output=self.value(job.output), error=self.value(job.error))


def shown_job(store: Store, job: JobRecord) -> JobRecord:
    """``job`` as a list shows it: :meth:`SubjectView.job`, with the subject's key read only for
    a job whose output or error is sealed (a page of jobs costs no query per job)."""
    if not (is_sealed(job.output) or is_sealed(job.error)):
        return job
    return SubjectView(store, job.job_id).job(job)
