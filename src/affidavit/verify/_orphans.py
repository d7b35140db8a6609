"""Records without a job row (events, ledger rows or a seal left when a job row was deleted
outside the store), and event rows no read of their job's log returns."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from itertools import groupby
from operator import itemgetter

from affidavit.core.collector import collector_paused
from affidavit.core.seal import PublicKey
from affidavit.store import Snapshot, Store
from affidavit.verify._assemble import assemble
from affidavit.verify._fold import LogFold
from affidavit.verify._keys import KeyLike, accepted_keys, key_map, pinned_keys
from affidavit.verify._ledger import ledger_column_disagreements
from affidavit.verify._parts import ReplayProof, printable
from affidavit.verify.result import VerificationResult


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
    keys = accepted_keys(trusted_keys, recorded, key_map=key_map, pinned=pinned_keys)
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
    return replace(
        result, replay_proof_result=ReplayProof(False, printable(error), "position", None)
    )


def _orphan_fold(job_id: str, held: list[str]) -> LogFold:
    """A fold whose first violation is the missing job row: what the result reports first.
    (An id read leniently from SQLite text that is not UTF-8 is reported escaped.)"""
    fold = LogFold(printable(job_id))
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
        row_errors = ledger_column_disagreements(fold, snap.iter_ledger_columns(job_id))
        try:
            seal = snap.seal_get(job_id)
        except ValueError as exc:  # a seal row edited outside the store
            seal_problem = str(exc)
    result = assemble(
        fold, status=None, row_errors=row_errors, seal=seal, keys=keys, seal_problem=seal_problem
    )
    return replace(result, status=None, orphan=True)
