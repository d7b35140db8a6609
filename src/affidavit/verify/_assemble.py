"""The result of one pass: the fold's findings and the records read beside the log, assembled
into a :class:`~affidavit.verify.result.VerificationResult`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from affidavit.core.seal import PublicKey, Seal
from affidavit.store import TERMINAL_STATUSES
from affidavit.verify._digest import canonical_hash_matches
from affidavit.verify._fold import LogFold
from affidavit.verify._seal_check import check_seal
from affidavit.verify.result import (
    LedgerProof,
    ReplayProof,
    SealCheck,
    StoredChainCheck,
    VerificationResult,
)


def assemble(
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
        tuple(map(printable, ledger_errors)),
        tuple(map(printable, fold.unknown)),
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
        replay = ReplayProof(False, printable(f"{invariant}{where}: {detail}"), invariant, version)
    chain = StoredChainCheck(fold.first_bad_version is None, fold.first_bad_version, fold.count)
    sealed = (
        check_seal(fold, seal, keys, terminal, shown_status)
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
        seal=replace(sealed, key_id=printable(sealed.key_id), error=printable(sealed.error)),
        status=printable(shown_status),
    )


def printable(value: Any) -> Any:
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
