"""The parts of a verification result: one per check of the registry
(:mod:`affidavit.verify._checks`), each reporting as its object of docs/formats.md §6."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LedgerProof:
    """At most once: every started invocation is closed exactly once, nothing is finished
    without having started, no key is committed twice, and the ledger rows agree with the log.
    ``pending_idempotency_keys`` are keys with an open invocation (legitimate while a job is
    running, waiting or parked; a failure once it is terminal)."""

    ok: bool
    pending_idempotency_keys: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    # keys closed with the outcome `unknown`: the tool may or may not have acted (a forced
    # cancel, a job failed with the call in flight); never verified as done nor as not done
    unknown_outcome_keys: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "ok": self.ok,
            "pending_idempotency_keys": list(self.pending_idempotency_keys),
        }
        if self.unknown_outcome_keys:
            doc["unknown_outcome_keys"] = list(self.unknown_outcome_keys)
        return doc


@dataclass(frozen=True, slots=True)
class ReplayProof:
    """The log replays into a consistent state. ``error`` names the first violated invariant
    (``invariant``) and the event version where it was violated (``version``)."""

    ok: bool
    error: str = ""
    invariant: str | None = None
    version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error}


@dataclass(frozen=True, slots=True)
class StoredChainCheck:
    """Every stored chain hash recomputes from the stored bytes, versions run 1..n."""

    ok: bool
    first_bad_version: int | None
    event_count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "first_bad_version": self.first_bad_version,
            "event_count": self.event_count,
        }


@dataclass(frozen=True, slots=True)
class SealCheck:
    """The seal is present (required once the job is terminal), signed by a known key, covers
    exactly this log (its length and chain root), and — once logged — is the job's one leaf in
    the transparency log (``codes`` names a failure there)."""

    present: bool
    ok: bool
    key_id: str | None = None
    event_count: int | None = None
    error: str = ""
    # failures against the transparency log, by name: ``seal_superseded``, ``log_duplicate``
    # (see affidavit.verify._logged)
    codes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "present": self.present,
            "ok": self.ok,
            "key_id": self.key_id,
            "event_count": self.event_count,
            "error": self.error,
            "codes": list(self.codes),
        }


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the human report."""

    name: str
    ok: bool
    detail: str


def printable(value: Any) -> Any:
    """``value`` as text every encoder takes: SQLite text that is not UTF-8 is read leniently
    as lone surrogates (see :func:`~affidavit.verify.verify_job`), and a result quoting it (a
    seal's key id, a job's status, a ledger key) must still print and serialize; those come out
    as ``\\udcxx`` escapes. Anything else is returned as it is."""
    if type(value) is not str:
        return value
    try:
        value.encode()
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode()
    return value
