"""Verification Mode: ``verify_job`` over the database, ``verify_events`` over an export.

Read-only: nothing is written, whatever the job's status. The contract, in order:

(1) read the job row, its whole log, its ledger rows, its seal and the known public keys in one
    consistent snapshot (the job may be running while we read);
(2) stream the log once through :class:`~affidavit.verify._fold.LogFold`: recompute every chain
    hash (root and stored-hash check), the execution hash and the replay invariants;
(3) compare the ledger rows with the log (ledger proof);
(4) compare the job's stored status with the log (replay proof);
(5) check the seal: required once the job is terminal, signed by a known (or trusted) key,
    covering exactly the recomputed length and root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from affidavit.core.collector import collector_paused
from affidavit.core.errors import JobNotFound, VerificationError
from affidavit.core.seal import Seal
from affidavit.record import seal_document
from affidavit.store import LedgerColumns, LedgerRow, Store, StoredEvent, unmatchable
from affidavit.verify._assemble import assemble
from affidavit.verify._fold import LogFold
from affidavit.verify._inputs import chained, event_job_id, event_parts
from affidavit.verify._keys import KeyLike, accepted_keys, key_map, pinned_keys
from affidavit.verify._ledger import (
    LedgerDigest,
    ledger_column_disagreements,
    ledger_columns,
    ledger_disagreements,
)
from affidavit.verify._logged import LEAVES_READ, with_log_check
from affidavit.verify._orphans import (
    Misplaced,
    misplaced_events,
    orphan_results,
    verify_orphans,
    with_misplaced,
)
from affidavit.verify._seal_check import parse_seal
from affidavit.verify.result import VerificationResult

__all__ = [
    "KeyLike",
    "LedgerDigest",
    "Misplaced",
    "check_trusted_keys",
    "misplaced_events",
    "orphan_results",
    "seal_document",
    "verify_event_rows",
    "verify_events",
    "verify_job",
    "verify_orphans",
    "with_misplaced",
]


def verify_job(
    store: Store, job_id: str, *, trusted_keys: Iterable[KeyLike] | None = None
) -> VerificationResult:
    """Verify one job of any status; never changes anything.

    ``trusted_keys`` pins the keys a seal may be signed with (public keys as
    :class:`~affidavit.core.seal.PublicKey`, raw 32 bytes or base64, or key ids of keys recorded
    in the database). Without it every key recorded in the database is accepted — which proves
    the log unchanged since sealing against anyone who cannot also write a key into the
    database.

    Raises:
        JobNotFound: no such job.
        StoreError: the database cannot be read.
    """
    _check_job_id(job_id)
    # text the database cannot decode (a column edited outside the store) fails a strict read:
    # the store reads again with such text kept as lone surrogates, so the row fails its checks
    return store.with_text_fallback(
        lambda lenient: _verify_job(store, job_id, trusted_keys, lenient_text=lenient)
    )


def _check_job_id(job_id: str) -> None:
    """No job has an id that is not Unicode text (a command line that is not UTF-8 reads as
    lone surrogates) or that holds a NUL (as for Store.get_job: PostgreSQL refuses it in a
    query, and the store's read would fail instead of finding nothing).

    Raises:
        JobNotFound: ``job_id`` is such an id.
    """
    if unmatchable(job_id):
        raise JobNotFound(job_id)


def _verify_job(
    store: Store, job_id: str, trusted_keys: Iterable[KeyLike] | None, *, lenient_text: bool
) -> VerificationResult:
    # (1) one snapshot
    with collector_paused(), store.snapshot(lenient_text=lenient_text) as snap:
        job = snap.job_row(job_id)  # (not parsed: the output column may hold anything)
        if job is None:
            raise JobNotFound(job_id)
        # (2) one streaming pass
        fold = LogFold(job_id)
        fold.feed_all(snap.iter_event_rows(job_id))
        fold.finish()
        # (3) the ledger rows, streamed too: every column the log has a counterpart of
        row_errors = ledger_column_disagreements(fold, snap.iter_ledger_columns(job_id))
        seal_problem = ""
        try:
            seal = snap.seal_get(job_id)
        except ValueError as exc:  # a seal row edited outside the store: fails the seal check
            seal, seal_problem = None, str(exc)
        recorded = snap.keys_list()
        leaves = [] if seal_problem else snap.tlog_leaves_of(job_id, LEAVES_READ)
    keys = accepted_keys(trusted_keys, recorded, key_map=key_map, pinned=pinned_keys)
    result = assemble(
        fold,
        status=job["status"],
        row_errors=row_errors,
        seal=seal,
        keys=keys,
        seal_problem=seal_problem,
        job_row=job,
    )
    return with_log_check(result, seal, leaves)


def check_trusted_keys(store: Store, trusted_keys: Iterable[KeyLike]) -> None:
    """Check ``trusted_keys`` as :func:`verify_job` would, before any job is read: so that a
    malformed key, or a key id the database does not record, is an error even when no job is
    verified with it.

    Raises:
        ConfigError: a key is malformed or names no recorded key.
    """
    with store.snapshot() as snap:
        recorded = snap.keys_list()
    pinned_keys(trusted_keys, recorded)


def verify_events(
    events: Iterable[StoredEvent | Mapping[str, Any]],
    *,
    public_keys: Iterable[KeyLike] | Mapping[str, bytes] = (),
    seal: Seal | Mapping[str, Any] | None = None,
    ledger: Iterable[LedgerRow] | None = None,
    status: str | None = None,
    job_id: str | None = None,
    ledger_digests: Iterable[tuple[str, str, str, str | None]] | None = None,
) -> VerificationResult:
    """Verify an exported event list without a database.

    ``events`` in version order: :class:`~affidavit.store.StoredEvent` objects, or mappings
    shaped like ``affidavit jobs events --json`` output (``version``, ``event_id``, ``type``,
    ``payload`` — the decoded object, or its stored bytes — and ``chain_hash``). ``seal`` is the
    job's seal (a terminal job without one fails the seal check), checked against
    ``public_keys`` only. ``ledger`` rows, when given, are compared with the log as
    :func:`verify_job` compares the stored ones (every column with a counterpart in the log).
    ``status`` is the job's claimed status; without it the status the log ends in is used.
    ``ledger_digests`` is the ledger in digest form instead of rows — ``(idempotency key,
    status, invocation id, hex SHA-256 of JCS(result) or None)`` — as a proof pack carries it.

    An event of another job than the first event's (or ``job_id``'s) fails the replay proof
    at its version (invariant ``payload``).

    Raises:
        VerificationError: the input is not an event list (a malformed entry is named), the
            job id is not Unicode text, or the seal is malformed.
        ConfigError: a public key is not a raw 32-byte Ed25519 key (or its base64).
    """
    iterator = iter(events)
    try:
        first = next(iterator)
    except StopIteration:
        first = None
    if job_id is None:
        job_id = event_job_id(first) if first is not None else None
    if job_id is None:
        raise VerificationError(
            "the events name no job id", hint="Pass job_id=... (exports may omit it per event)."
        )
    fold = _new_fold(job_id)
    rows = (
        (
            event_parts(row, position, fold)
            for position, row in enumerate(chained(first, iterator), 1)
        )
        if first is not None
        else ()
    )
    return _verify_rows(
        fold,
        rows,
        None,
        public_keys=public_keys,
        seal=seal,
        status=status,
        ledgers=[ledger_digests] if ledger_digests is not None else [],
        ledger_rows=map(ledger_columns, ledger) if ledger is not None else None,
    )


def verify_event_rows(
    job_id: str,
    rows: Iterable[tuple[int, str, str, bytes, str | None]],
    *,
    parsed: Iterable[Any] | None = None,
    public_keys: Iterable[KeyLike] | Mapping[str, bytes] = (),
    seal: Seal | Mapping[str, Any] | None = None,
    status: str | None = None,
    ledgers: Iterable[Iterable[LedgerDigest]] = (),
) -> VerificationResult:
    """:func:`verify_events` for events already in row form — ``(version, event_id, type,
    payload bytes, stored chain hash)`` in version order — with ``parsed``, when given, each
    payload exactly as ``orjson.loads`` reads its bytes (see
    :meth:`~affidavit.verify._fold.LogFold.feed_all`); each of ``ledgers`` is compared with
    the log on its own, in the digest form of ``verify_events``' ``ledger_digests``.

    Raises:
        VerificationError: the job id is not Unicode text, the seal is malformed (or a
            caller's row iterator raised it).
        ConfigError: a public key is not a raw 32-byte Ed25519 key (or its base64).
    """
    return _verify_rows(
        _new_fold(job_id),
        rows,
        parsed,
        public_keys=public_keys,
        seal=seal,
        status=status,
        ledgers=ledgers,
    )


def _new_fold(job_id: str) -> LogFold:
    try:
        job_id.encode()
    except UnicodeEncodeError:
        raise VerificationError(f"the job id {job_id!a} is not Unicode text") from None
    return LogFold(job_id)


def _verify_rows(
    fold: LogFold,
    rows: Iterable[tuple[int, str, str, bytes, str | None]],
    parsed: Iterable[Any] | None,
    *,
    public_keys: Iterable[KeyLike] | Mapping[str, bytes],
    seal: Seal | Mapping[str, Any] | None,
    status: str | None,
    ledgers: Iterable[Iterable[LedgerDigest]],
    ledger_rows: Iterable[LedgerColumns] | None = None,
) -> VerificationResult:
    with collector_paused():
        fold.feed_all(rows, parsed)
    fold.finish()
    parsed_seal = parse_seal(seal)
    keys = key_map(public_keys.items() if isinstance(public_keys, Mapping) else public_keys)
    row_errors: list[str] = []
    if ledger_rows is not None:  # whole rows: every column verify_job compares
        row_errors += ledger_column_disagreements(fold, ledger_rows)
    for digests in ledgers:
        row_errors += ledger_disagreements(fold, digests)
    return assemble(fold, status=status, row_errors=row_errors, seal=parsed_seal, keys=keys)
