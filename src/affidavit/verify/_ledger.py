"""The ledger rows against the log: the row half of the ledger proof (and the replay proof's
invariant ``ledger``, its first disagreement). Streamed: only the set of keys seen is kept."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from affidavit.core.canonical import canonical_text
from affidavit.core.errors import AffidavitError
from affidavit.store import LedgerColumns, LedgerRow
from affidavit.verify._fold import LogFold

# a ledger row as compared with the log: (idempotency key, status, invocation id, hex SHA-256 of
# JCS(result) or None)
LedgerDigest = tuple[str, str, str, str | None]
_NO_COMMIT = object()  # what a key without a commit is committed with: equal to no digest
# the result digest of a row without a result (the column is NULL: read as JSON null)
_NO_RESULT = hashlib.sha256(b"null").hexdigest()


def ledger_disagreements(fold: LogFold, ledger: Iterable[LedgerDigest]) -> list[str]:
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


def ledger_column_disagreements(fold: LogFold, ledger: Iterable[LedgerColumns]) -> list[str]:
    """:func:`ledger_disagreements` over whole rows (see
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


def ledger_columns(row: LedgerRow) -> LedgerColumns:
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
