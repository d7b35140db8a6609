"""How each check of the registry (:mod:`affidavit.verify._checks`) is computed from what
one pass gathered (:class:`Evidence`): the fold's findings and the records read beside the log.

The checks run in registry order: the ledger proof reads the fold's ledger findings before the
replay proof adds the disagreements found outside the log (the job row, the ledger rows) as
its own violations."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from affidavit.core.seal import PublicKey, Seal
from affidavit.store import TERMINAL_STATUSES
from affidavit.verify._digest import canonical_hash_matches
from affidavit.verify._fold import LogFold
from affidavit.verify._parts import (
    LedgerProof,
    ReplayProof,
    SealCheck,
    StoredChainCheck,
    printable,
)
from affidavit.verify._seal_check import check_seal


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a check reads: the finished fold of the log, the status claimed for the job (the
    stored one, or ``None``: the log's), the ledger rows' disagreements with the log, the seal
    (and why its row could not be read, if so), the accepted keys and the job row (``verify_job``
    only)."""

    fold: LogFold
    status: str | None
    row_errors: list[str]
    seal: Seal | None
    keys: dict[str, PublicKey]
    seal_problem: str = ""
    job_row: Mapping[str, Any] | None = None

    @property
    def shown_status(self) -> str:
        """The status the result reports: the claimed one, else the log's."""
        return self.status if self.status is not None else self.fold.log_status

    @property
    def terminal(self) -> bool:
        return self.shown_status in TERMINAL_STATUSES or self.fold.log_status in TERMINAL_STATUSES


def execution_hash(ev: Evidence) -> str:
    return ev.fold.execution_hash()


def chain_root(ev: Evidence) -> str:
    return ev.fold.root


def ledger_proof(ev: Evidence) -> LedgerProof:
    fold, pending = ev.fold, ev.fold.pending_keys
    ledger_errors = list(fold.ledger_errors) + ev.row_errors
    if ev.terminal and pending:
        ledger_errors.append(
            f"the job is {ev.shown_status} but {len(pending)} invocation(s) were never closed"
        )
    return LedgerProof(
        not ledger_errors,
        pending,
        tuple(map(printable, ledger_errors)),
        tuple(map(printable, fold.unknown)),
    )


def replay_proof(ev: Evidence) -> ReplayProof:
    fold, status = ev.fold, ev.status
    # the stored status against the log
    if status is not None and not _status_agrees(status, fold.log_status):
        fold.violate("status", None, f"the job is {status} but its log says {fold.log_status}")
    if ev.job_row is not None:
        _job_row_disagreement(fold, ev.job_row)
    if ev.row_errors:
        fold.violate("ledger", None, ev.row_errors[0])
    if fold.replay_error is None:
        return ReplayProof(True)
    invariant, version, detail = fold.replay_error
    where = f" at version {version}" if version is not None else ""
    return ReplayProof(False, printable(f"{invariant}{where}: {detail}"), invariant, version)


def stored_chain(ev: Evidence) -> StoredChainCheck:
    fold = ev.fold
    return StoredChainCheck(fold.first_bad_version is None, fold.first_bad_version, fold.count)


def seal_check(ev: Evidence) -> SealCheck:
    sealed = (
        check_seal(ev.fold, ev.seal, ev.keys, ev.terminal, ev.shown_status)
        if not ev.seal_problem
        else SealCheck(True, False, error=f"the seal row is malformed: {ev.seal_problem}")
    )
    return replace(sealed, key_id=printable(sealed.key_id), error=printable(sealed.error))


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
