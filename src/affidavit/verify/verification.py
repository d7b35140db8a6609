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

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from itertools import groupby
from operator import itemgetter
from typing import Any

from affidavit.core.canonical import canonical_of_parsed, canonical_text
from affidavit.core.collector import collector_paused
from affidavit.core.errors import (
    AffidavitError,
    ConfigError,
    JobNotFound,
    VerificationError,
)
from affidavit.core.seal import (
    PUBLIC_KEY_BYTES,
    PublicKey,
    Seal,
    check_signature,
    events_root,
    unb64,
)
from affidavit.store import (
    TERMINAL_STATUSES,
    LedgerColumns,
    LedgerRow,
    Snapshot,
    Store,
    StoredEvent,
    unmatchable,
)
from affidavit.verify._digest import canonical_hash_matches
from affidavit.verify._fold import LogFold
from affidavit.verify._keys import accepted_keys, unknown_key_error
from affidavit.verify._logged import LEAVES_READ, with_log_check
from affidavit.verify.result import (
    LedgerProof,
    ReplayProof,
    SealCheck,
    StoredChainCheck,
    VerificationResult,
)

KeyLike = PublicKey | bytes | str
# a ledger row as compared with the log: (idempotency key, status, invocation id, hex SHA-256 of
# JCS(result) or None)
LedgerDigest = tuple[str, str, str, str | None]
_KEY_ID = re.compile(r"^[0-9a-f]{16}\Z")
_NO_COMMIT = object()  # what a key without a commit is committed with: equal to no digest
# the result digest of a row without a result (the column is NULL: read as JSON null)
_NO_RESULT = hashlib.sha256(b"null").hexdigest()
_KEY_HINT = (
    "Give a raw 32-byte Ed25519 public key in standard base64 (as `affidavit keys show` prints "
    "it), or the 16-hex key id of a key recorded in the database."
)


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
        row_errors = _ledger_column_disagreements(fold, snap.iter_ledger_columns(job_id))
        seal_problem = ""
        try:
            seal = snap.seal_get(job_id)
        except ValueError as exc:  # a seal row edited outside the store: fails the seal check
            seal, seal_problem = None, str(exc)
        recorded = snap.keys_list()
        leaves = [] if seal_problem else snap.tlog_leaves_of(job_id, LEAVES_READ)
    keys = accepted_keys(trusted_keys, recorded, key_map=_key_map, pinned=_trusted)
    result = _assemble(
        fold,
        status=job["status"],
        row_errors=row_errors,
        seal=seal,
        keys=keys,
        seal_problem=seal_problem,
        job_row=job,
    )
    return with_log_check(result, seal, leaves)


def verify_orphans(
    store: Store, *, job_id: str | None = None, trusted_keys: Iterable[KeyLike] | None = None
) -> list[VerificationResult]:
    """Every job id that has events, ledger rows or a seal but no job row — records left
    behind when a job row was deleted outside the store, which :func:`verify_job` cannot find
    — ordered by job id; only ``job_id`` when given (``[]`` when it has a job row, or no
    record at all). Read-only, in one snapshot.

    Each result is ``orphan``, has no ``status`` and fails: its replay proof names the missing
    row (invariant ``status``, e.g. ``the job has no job row: the database holds its events,
    ledger rows and a seal``). The records left are checked as :func:`verify_job` checks a
    job's (its log recomputed, its ledger rows against the log, its seal against the log's
    length and root; a seal is required when the log ends in a terminal event), so the
    result also says what was deleted.

    Raises:
        ConfigError: a trusted key is malformed or names no recorded key.
        StoreError: the database cannot be read.
    """

    def read(lenient: bool) -> list[VerificationResult]:
        with collector_paused(), store.snapshot(lenient_text=lenient) as snap:
            return orphan_results(snap, job_id=job_id, trusted_keys=trusted_keys)

    return store.with_text_fallback(read)  # (text not UTF-8: read again, as verify_job does)


def orphan_results(
    snap: Snapshot, *, job_id: str | None = None, trusted_keys: Iterable[KeyLike] | None = None
) -> list[VerificationResult]:
    """:func:`verify_orphans` inside an open snapshot (as ``affidavit verify --all`` reads the
    job ids and the orphans at one moment). The logs are streamed in one pass, one job after
    another; the ledger rows and seals are read once that stream ended (a snapshot reads one
    statement at a time)."""
    found: dict[str, list[str]] = {}
    for orphan_id, what in snap.iter_orphans(job_id):
        found.setdefault(orphan_id, []).append(what)
    if not found:
        return []
    recorded = snap.keys_list()
    keys = accepted_keys(trusted_keys, recorded, key_map=_key_map, pinned=_trusted)
    folds: dict[str, LogFold] = {}
    for orphan_id, rows in groupby(snap.iter_orphan_event_rows(job_id), key=itemgetter(0)):
        fold = _orphan_fold(orphan_id, found.get(orphan_id, ["events"]))
        fold.feed_all(row[1:] for row in rows)
        folds[orphan_id] = fold
    for orphan_id, held in found.items():
        if orphan_id not in folds:  # no event left
            folds[orphan_id] = _orphan_fold(orphan_id, held)
    return [_orphan_result(snap, orphan_id, folds[orphan_id], keys) for orphan_id in found]


Misplaced = tuple[str, int, int, "str | None"]  # see Snapshot.iter_misplaced_events


def misplaced_events(snap: Snapshot) -> dict[str, list[Misplaced]]:
    """The event rows of each job that no read of its log returns (on SQLite, rows whose
    position lies outside the job's range: put there by hand), by job id — read in ``snap`` in
    one pass over the events table, as ``affidavit verify --all`` does."""
    found: dict[str, list[Misplaced]] = {}
    for row in snap.iter_misplaced_events():
        found.setdefault(row[0], []).append(row)
    return found


def with_misplaced(result: VerificationResult, rows: list[Misplaced]) -> VerificationResult:
    """``result`` failing its replay proof (invariant ``position``) for ``rows``, event rows of
    its job that no read of its log returns — unless it already fails there."""
    if not rows or not result.replay_proof_result.ok:
        return result
    _, version, position, holder = rows[0]
    where = f"in job {holder}'s log" if holder is not None else "in no job's log"
    more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
    error = (
        f"position: the events table holds a row of this job that no read of its log returns: "
        f"version {version} at position {position}, {where}{more}; it was put there outside "
        "affidavit"
    )
    return replace(result, replay_proof_result=ReplayProof(False, _text(error), "position", None))


def _orphan_fold(job_id: str, held: list[str]) -> LogFold:
    """A fold whose first violation is the missing job row: what the result reports first.
    (An id read leniently from SQLite text that is not UTF-8 is reported escaped.)"""
    fold = LogFold(_text(job_id))
    parts = [f"its {what}" if what != "seal" else "a seal" for what in held]
    listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    fold.violate("status", None, f"the job has no job row: the database holds {listed}")
    return fold


def _orphan_result(
    snap: Snapshot, job_id: str, fold: LogFold, keys: dict[str, PublicKey]
) -> VerificationResult:
    fold.finish()
    row_errors: list[str] = []
    seal, seal_problem = None, ""
    if fold.job_id == job_id:  # (an id that is not text cannot be looked up again)
        row_errors = _ledger_column_disagreements(fold, snap.iter_ledger_columns(job_id))
        try:
            seal = snap.seal_get(job_id)
        except ValueError as exc:  # a seal row edited outside the store
            seal_problem = str(exc)
    result = _assemble(
        fold, status=None, row_errors=row_errors, seal=seal, keys=keys, seal_problem=seal_problem
    )
    return replace(result, status=None, orphan=True)


def seal_document(store: Store, job_id: str) -> dict[str, Any]:
    """The job's seal as an offline verifier takes it (``verify_events(..., seal=...)``):
    ``{"seal": Seal.to_dict() or None, "error": None}``; a seal row that cannot be read (it was
    edited) gives ``{"seal": None, "error": why}``. The job must exist.

    Raises:
        JobNotFound: no such job.
    """
    _check_job_id(job_id)
    with store.snapshot() as snap:
        if snap.job_row(job_id) is None:
            raise JobNotFound(job_id)
        try:
            seal = snap.seal_get(job_id)
        except ValueError as exc:
            return {"seal": None, "error": f"the seal row is malformed: {exc}"}
    return {"seal": seal.to_dict() if seal is not None else None, "error": None}


def check_trusted_keys(store: Store, trusted_keys: Iterable[KeyLike]) -> None:
    """Check ``trusted_keys`` as :func:`verify_job` would, before any job is read: so that a
    malformed key, or a key id the database does not record, is an error even when no job is
    verified with it.

    Raises:
        ConfigError: a key is malformed or names no recorded key.
    """
    with store.snapshot() as snap:
        recorded = snap.keys_list()
    _trusted(trusted_keys, recorded)


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
        job_id = _event_job_id(first) if first is not None else None
    if job_id is None:
        raise VerificationError(
            "the events name no job id", hint="Pass job_id=... (exports may omit it per event)."
        )
    fold = _new_fold(job_id)
    rows = (
        (
            _event_parts(row, position, fold)
            for position, row in enumerate(_chain(first, iterator), 1)
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
        ledger_rows=map(_ledger_columns, ledger) if ledger is not None else None,
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
    parsed_seal = _parse_seal(seal)
    keys = _key_map(public_keys.items() if isinstance(public_keys, Mapping) else public_keys)
    row_errors: list[str] = []
    if ledger_rows is not None:  # whole rows: every column verify_job compares
        row_errors += _ledger_column_disagreements(fold, ledger_rows)
    for digests in ledgers:
        row_errors += _ledger_disagreements(fold, digests)
    return _assemble(fold, status=status, row_errors=row_errors, seal=parsed_seal, keys=keys)


# --- assembling the result ----------------------------------------------------------------------


def _assemble(
    fold: LogFold,
    *,
    status: str | None,
    row_errors: list[str],
    seal: Seal | None,
    keys: dict[str, PublicKey],
    seal_problem: str = "",
    job_row: Mapping[str, Any] | None = None,
) -> VerificationResult:
    log_status = fold.log_status
    shown_status = status if status is not None else log_status
    terminal = shown_status in TERMINAL_STATUSES or log_status in TERMINAL_STATUSES
    pending = fold.pending_keys
    ledger_errors = list(fold.ledger_errors) + row_errors
    if terminal and pending:
        ledger_errors.append(
            f"the job is {shown_status} but {len(pending)} invocation(s) were never closed"
        )
    ledger_proof = LedgerProof(
        not ledger_errors,
        pending,
        tuple(map(_text, ledger_errors)),
        tuple(map(_text, fold.unknown)),
    )
    # (4) stored status against the log
    if status is not None and not _status_agrees(status, log_status):
        fold.violate("status", None, f"the job is {status} but its log says {log_status}")
    if job_row is not None:
        _job_row_disagreement(fold, job_row)
    if row_errors:
        fold.violate("ledger", None, row_errors[0])
    if fold.replay_error is None:
        replay = ReplayProof(True)
    else:
        invariant, version, detail = fold.replay_error
        where = f" at version {version}" if version is not None else ""
        replay = ReplayProof(False, _text(f"{invariant}{where}: {detail}"), invariant, version)
    chain = StoredChainCheck(fold.first_bad_version is None, fold.first_bad_version, fold.count)
    sealed = (
        _check_seal(fold, seal, keys, terminal, shown_status)
        if not seal_problem
        else SealCheck(True, False, error=f"the seal row is malformed: {seal_problem}")
    )
    return VerificationResult(
        job_id=fold.job_id,
        execution_hash=fold.execution_hash(),
        event_chain_root_hash=fold.root,
        tool_invocation_ledger_proof=ledger_proof,
        replay_proof_result=replay,
        stored_chain=chain,
        seal=replace(sealed, key_id=_text(sealed.key_id), error=_text(sealed.error)),
        status=_text(shown_status),
    )


def _text(value: Any) -> Any:
    """``value`` as text every encoder takes: SQLite text that is not UTF-8 is read leniently
    as lone surrogates (see :func:`verify_job`), and a result quoting it (a seal's key id, a
    job's status, a ledger key) must still print and serialize; those come out as ``\\udcxx``
    escapes. Anything else is returned as it is."""
    if type(value) is not str:
        return value
    try:
        value.encode()
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode()
    return value


def _status_agrees(status: str, log_status: str) -> bool:
    if status in ("pending", "running"):
        # A claim writes no event, and a crashed run stays "running" until it is reclaimed.
        return log_status in ("pending", "running")
    return status == log_status


def _job_row_disagreement(fold: LogFold, row: Mapping[str, Any]) -> None:
    """The job row's columns that the log records too, against the log: the namespace, plan
    name, submitter and idempotency key are those of ``job_created``; a completed job's output
    (JSON text) is its ``job_completed`` output, a failed job's error its ``job_failed`` error,
    and every other job has neither."""
    created = fold.created_payload or {}
    for column in ("namespace", "plan_name", "submitted_by", "idempotency_key"):
        if row[column] != created.get(column):
            fold.violate("status", None, f"the job row's {column} is not its log's")
            return
    terminal = fold.terminal_payload or {}
    for column, status in (("output", "completed"), ("error", "failed")):
        stored = row[column]
        expected = terminal.get(column) if fold.log_status == status else None
        if stored is None and expected is None:
            continue
        try:
            digest = hashlib.sha256(stored.encode()).hexdigest() if type(stored) is str else ""
        except UnicodeEncodeError:  # SQLite text that is not UTF-8, read leniently
            digest = ""
        if expected is None or not canonical_hash_matches(expected, digest):
            fold.violate("status", None, f"the job row's {column} is not its log's")
            return


def _ledger_disagreements(fold: LogFold, ledger: Iterable[LedgerDigest]) -> list[str]:
    """Each ledger row — ``(key, status, invocation_id, result digest)`` — against what the log
    says about its key (streamed: only the set of keys seen is kept)."""
    errors: list[str] = []
    seen: set[str] = set()
    committed, started = fold.committed, fold.started
    add = seen.add
    for key, status, invocation_id, result_digest in ledger:
        # The common row first: a committed key whose result matches the log's commit, and
        # whose invocation is the one the log committed (its key's latest start).
        if (
            status == "committed"
            and committed.get(key, _NO_COMMIT) == result_digest
            and started[key][0] == invocation_id
            and key not in seen
        ):
            add(key)
            continue
        before = len(errors)
        _row_disagreements(fold, key, status, invocation_id, result_digest, seen, errors)
        if len(errors) == before and _another_invocation(started[key], status, invocation_id):
            errors.append(_not_as_started(key, ["invocation_id"]))
    _never_recorded(fold, seen, errors)
    return errors


def _another_invocation(log: tuple[Any, ...], status: Any, invocation_id: Any) -> bool:
    """Whether a committed or failed ledger row names another invocation than its key's
    latest ``tool_invocation_started`` (``log``: what :attr:`LogFold.started` holds)."""
    return status in ("committed", "failed") and invocation_id != log[0]


def _not_as_started(key: str, columns: list[str]) -> str:
    return (
        f"ledger row {key[:16]}…: {', '.join(columns)} not as in its tool_invocation_started event"
    )


def _ledger_column_disagreements(fold: LogFold, ledger: Iterable[LedgerColumns]) -> list[str]:
    """:func:`_ledger_disagreements` over whole rows (see
    :meth:`~affidavit.store.Snapshot.iter_ledger_columns`): besides the status,
    the invocation id and the result, a row's node, step id, tool name and arguments hash are
    those of its key's ``tool_invocation_started`` (the latest one: a key is invoked by one
    node only), and a committed or failed row names the latest invocation of its key."""
    errors: list[str] = []
    seen: set[str] = set()
    committed, started = fold.committed, fold.started
    add, sha256 = seen.add, hashlib.sha256
    for key, status, invocation_id, text, node_id, step_id, tool_name, args_hash in ledger:
        # the digest of the stored result text (None: the column holds something else)
        try:
            digest = sha256(text.encode()).hexdigest() if type(text) is str else None
        except UnicodeEncodeError:  # SQLite text that is not UTF-8, read leniently
            digest = None
        if (
            status == "committed"
            and committed.get(key, _NO_COMMIT) == digest
            and started.get(key) == (invocation_id, node_id, tool_name, args_hash, step_id)
            and key not in seen
        ):
            add(key)
            continue
        before = len(errors)
        _row_disagreements(fold, key, status, invocation_id, digest, seen, errors)
        log = started.get(key) if type(key) is str else None
        if log is None or len(errors) > before:
            continue
        differ = [
            column
            for column, value, expected in (
                ("node_id", node_id, log[1]),
                ("step_id", step_id, log[4]),
                ("tool_name", tool_name, log[2]),
                ("args_hash", args_hash, log[3]),
            )
            if value != expected
        ]
        if _another_invocation(log, status, invocation_id):
            differ.insert(0, "invocation_id")
        if differ:
            errors.append(_not_as_started(key, differ))
    _never_recorded(fold, seen, errors)
    return errors


def _row_disagreements(
    fold: LogFold,
    key: Any,
    status: Any,
    invocation_id: Any,
    result_digest: Any,
    seen: set[str],
    errors: list[str],
) -> None:
    """What is wrong with one ledger row that is not a plain committed match."""
    if type(key) is not str:
        errors.append(f"a ledger row's idempotency key is {type(key).__name__}, not text")
        return
    if key in seen:
        errors.append(f"ledger row {key[:16]}… appears twice")
        return
    seen.add(key)
    short = key[:16] + "…"
    committed, open_by_key = fold.committed, fold.open_by_key
    if key not in fold.started:
        errors.append(f"ledger row {short} has no invocation in the log")
    elif status == "committed":
        if key not in committed:
            errors.append(f"ledger row {short} is committed but the log has no commit")
        elif result_digest != committed[key]:
            errors.append(f"ledger row {short}: result does not match the committed hash")
    elif status == "started":
        open_invocation = open_by_key.get(key)
        if open_invocation is None:
            errors.append(f"ledger row {short} is started but the log closed it")
        elif open_invocation != invocation_id:
            errors.append(f"ledger row {short} names another invocation than the log")
        elif result_digest != _NO_RESULT:
            errors.append(f"ledger row {short} is started but holds a result")
    elif status == "failed":
        if key in committed:
            errors.append(f"ledger row {short} is failed but the log committed it")
        elif key in open_by_key:
            errors.append(f"ledger row {short} is failed but the log has it open")
        elif result_digest != _NO_RESULT:  # only a commit records a result
            errors.append(f"ledger row {short} is failed but holds a result")
    else:
        errors.append(f"ledger row {short} has unknown status {status!r}")


def _never_recorded(fold: LogFold, seen: set[str], errors: list[str]) -> None:
    for key in sorted(fold.started.keys() - seen):
        errors.append(f"key {key[:16]}… was invoked but has no ledger row")


def _ledger_columns(row: LedgerRow) -> LedgerColumns:
    """A ledger row as :meth:`~affidavit.store.Snapshot.iter_ledger_columns` reads
    it: its result as the stored text, its JCS (``""`` when it cannot be canonicalized)."""
    try:
        text = canonical_text(row.result)
    except (AffidavitError, RecursionError):
        text = ""
    return (
        row.idempotency_key,
        row.status,
        row.invocation_id,
        text,
        row.node_id,
        row.step_id,
        row.tool_name,
        row.args_hash,
    )


# (5) the seal


def _check_seal(
    fold: LogFold, seal: Seal | None, keys: dict[str, PublicKey], terminal: bool, status: str
) -> SealCheck:
    if seal is None:
        if terminal:
            return SealCheck(False, False, error=f"the job is {status} but has no seal")
        return SealCheck(False, True)
    error = ""
    key = keys.get(seal.key_id)
    if seal.job_id != fold.job_id:
        error = f"the seal is for job {seal.job_id!r}"
    elif key is None:
        error = unknown_key_error(keys, seal.key_id)
    else:
        try:
            error = check_signature(seal, key.public_key)
        except AffidavitError as exc:  # a field the signed message cannot hold
            error = f"the seal cannot be checked: {exc.message}"
    if not error and seal.event_count != fold.count:
        error = f"the seal covers {seal.event_count} events, the log has {fold.count}"
    if not error and seal.event_chain_root_hash != fold.root:
        error = "the seal's chain root does not match the log (re-chained or altered)"
    if not error and seal.version >= 2 and seal.events_root != events_root(fold.heads):
        error = "the seal's events_root does not match the log's events (v2 seal altered)"
    if not error and not terminal:
        error = "a seal on a job that is not terminal"
    return SealCheck(True, not error, seal.key_id, seal.event_count, error)


# --- inputs -------------------------------------------------------------------------------------


def _key_map(keys: Iterable[Any]) -> dict[str, PublicKey]:
    found: dict[str, PublicKey] = {}
    for item in keys:
        key = _public_key(item)
        found[key.key_id] = key
    return found


def _public_key(item: Any) -> PublicKey:
    if isinstance(item, PublicKey):
        return item
    if isinstance(item, tuple) and len(item) == 2:  # (key_id, raw) from a mapping
        return _public_key(item[1])
    if isinstance(item, str):
        try:
            item = unb64(item.strip())
        except ValueError as exc:
            raise ConfigError(f"public key {item!r} is {exc}", hint=_KEY_HINT) from None
    if isinstance(item, bytes | bytearray):
        if len(item) != PUBLIC_KEY_BYTES:
            raise ConfigError(
                f"a public key is {PUBLIC_KEY_BYTES} bytes, not {len(item)}", hint=_KEY_HINT
            )
        return PublicKey.from_raw(bytes(item))
    raise ConfigError(f"not a public key: {type(item).__name__}", hint=_KEY_HINT)


def _trusted(trusted: Iterable[KeyLike], recorded: list[PublicKey]) -> dict[str, PublicKey]:
    by_id = {k.key_id: k for k in recorded}
    found: dict[str, PublicKey] = {}
    for item in trusted:
        if isinstance(item, str) and _KEY_ID.match(item):
            if item not in by_id:
                raise ConfigError(
                    f"trusted key id {item} is not recorded in the database",
                    hint="Pass the public key itself (base64) instead of its id.",
                )
            found[item] = by_id[item]
        else:
            key = _public_key(item)
            found[key.key_id] = key
    return found


def _parse_seal(seal: Seal | Mapping[str, Any] | None) -> Seal | None:
    if seal is None or isinstance(seal, Seal):
        return seal
    try:
        return Seal.from_dict(seal)
    except ValueError as exc:
        raise VerificationError(f"malformed seal: {exc}") from None


def _foreign(fold: LogFold, version: Any, event_type: Any, job_id: Any) -> None:
    fold.violate(
        "payload",
        version,
        f"{event_type!s}: the event belongs to job {job_id!a}, not {fold.job_id!a}",
    )


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _event_job_id(event: Any) -> str | None:
    if isinstance(event, StoredEvent):
        return event.job_id
    if isinstance(event, Mapping):
        value = event.get("job_id")
        return value if isinstance(value, str) else None
    return None


def _event_parts(
    event: Any, position: int, fold: LogFold
) -> tuple[int, str, str, bytes, str | None]:
    """One exported event as a row; an event of another job is reported to ``fold`` (before
    the fold reads it, so that the first violation is still the first reported)."""
    if isinstance(event, StoredEvent):
        if event.job_id != fold.job_id:
            _foreign(fold, event.version, event.type, event.job_id)
        return event.version, event.event_id, event.type, event.payload_bytes, event.chain_hash
    if not isinstance(event, Mapping):
        raise VerificationError(f"event #{position} is not an object")
    if "job_id" in event and event["job_id"] != fold.job_id:
        _foreign(fold, event.get("version"), event.get("type"), event["job_id"])
    try:
        version, event_id, event_type = event["version"], event["event_id"], event["type"]
        payload = event["payload"]
    except KeyError as exc:
        raise VerificationError(f"event #{position} lacks {exc.args[0]!r}") from None
    if type(version) is not int or not isinstance(event_id, str) or not isinstance(event_type, str):
        raise VerificationError(f"event #{position}: version, event_id or type is malformed")
    if isinstance(payload, bytes | bytearray):
        payload_bytes = bytes(payload)
    else:
        try:
            payload_bytes = canonical_of_parsed(payload)
        except AffidavitError as exc:
            raise VerificationError(f"event #{position}: payload: {exc.message}") from None
    chain_hash = event.get("chain_hash")
    return (
        version,
        event_id,
        event_type,
        payload_bytes,
        chain_hash if isinstance(chain_hash, str) else None,
    )
