"""A subject's event as a reader sees it: its sealed values opened while the subject's key
exists, shown as erased after (docs/privacy.md)."""

from __future__ import annotations

from typing import Any

from affidavit.core.privacy import JobCipher, erased_opener, open_payload
from affidavit.store import StoredEvent


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
