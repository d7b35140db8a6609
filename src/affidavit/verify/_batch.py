"""Verifying what the database holds for a job id, and every job at once: the service behind
``affidavit verify [JOB | --all]`` and ``GET /api/jobs/{id}/verify``, so that both verify the
same way (the faces only render)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from affidavit.core.collector import collector_paused
from affidavit.core.errors import JobNotFound
from affidavit.store import JobFilter, Store
from affidavit.verify._fork import ForkCheck, check_fork
from affidavit.verify.result import VerificationResult
from affidavit.verify.verification import (
    KeyLike,
    Misplaced,
    check_trusted_keys,
    misplaced_events,
    orphan_results,
    verify_job,
    verify_orphans,
    with_misplaced,
)


def verify_one(
    store: Store, job_id: str, *, trusted_keys: Iterable[KeyLike] | None = None
) -> VerificationResult:
    """:func:`~affidavit.verify.verify_job`; for a job id whose job row is gone but whose
    events, ledger rows or seal remain, the result of those records (failing: no job row, see
    :func:`~affidavit.verify.verify_orphans`) instead of "not found".

    Raises:
        JobNotFound: nothing in the database names ``job_id``.
        ConfigError: a trusted key is malformed or names no recorded key.
        StoreError: the database cannot be read.
    """
    keys = list(trusted_keys) if trusted_keys is not None else None
    try:
        return verify_job(store, job_id, trusted_keys=keys)
    except JobNotFound:
        orphans = verify_orphans(store, job_id=job_id, trusted_keys=keys)
        if not orphans:
            raise
        return orphans[0]


def verify_one_fork(
    store: Store, job_id: str, *, trusted_keys: Iterable[KeyLike] | None = None
) -> tuple[VerificationResult, ForkCheck | None]:
    """:func:`verify_one`, and for a fork the check of its reused prefix against its source's
    record (:func:`~affidavit.verify.check_fork`; ``None``: no fork, or an orphan). It raises
    what :func:`verify_one` raises."""
    result = verify_one(store, job_id, trusted_keys=trusted_keys)
    return result, (check_fork(store, job_id) if not result.orphan else None)


def verification_document(result: VerificationResult, fork: ForkCheck | None) -> dict[str, Any]:
    """The document ``verify --json`` and ``GET /api/jobs/{id}/verify`` print: the result's,
    with a fork's ``forked_from`` check, whose failure fails ``ok`` (a prefix the source's
    record does not hold is no verified job; one whose source is not in the store is
    ``unverified`` and said so, not failed)."""
    doc = result.to_dict()
    if fork is not None:
        doc["forked_from"] = fork.to_dict()
        doc["ok"] = doc["ok"] and fork.ok
    return doc


def verify_all(
    store: Store,
    filters: JobFilter | None = None,
    *,
    trusted_keys: Iterable[KeyLike] | None = None,
    started: Callable[[int], object] | None = None,
    each: Callable[[VerificationResult], object] | None = None,
) -> tuple[int, list[VerificationResult]]:
    """Verify every job that matches ``filters`` (their limit and offset are ignored) when the
    call starts, newest first. Without a filter (no status, namespace or plan name), then every
    job id that has events, ledger rows or a seal but no job row, read in the same snapshot as
    the job ids: each fails. (A filter selects jobs by their row, which those have not.) Also
    without a filter, a job with event rows no read of its log returns (on SQLite, rows placed
    by hand outside the job's range) fails its replay proof (invariant ``position``).

    ``started`` is called once with the number of jobs (not counting those without a row)
    before the first is verified; ``each`` with every result as it comes (those without a row
    last), so that a caller need not hold a result per job.

    Returns the number of results and the failed ones, in that order.

    Raises:
        ConfigError: a trusted key is malformed or names no recorded key (even with no job).
        StoreError: the database cannot be read.
    """
    filters = filters if filters is not None else JobFilter()
    keys = list(trusted_keys) if trusted_keys is not None else None
    if keys:
        check_trusted_keys(store, keys)
    # (text the database cannot decode among the orphans' records: read again, as verify_job)
    job_ids, orphans, misplaced = store.with_text_fallback(
        lambda lenient: _listing(store, filters, keys, lenient_text=lenient)
    )
    if started is not None:
        started(len(job_ids))
    failed: list[VerificationResult] = []
    for job_id in job_ids:
        result = verify_job(store, job_id, trusted_keys=keys)
        if job_id in misplaced:
            result = with_misplaced(result, misplaced[job_id])
        if each is not None:
            each(result)
        if not result.ok:
            failed.append(result)
    for orphan in orphans:  # (each fails)
        if each is not None:
            each(orphan)
        failed.append(orphan)
    return len(job_ids) + len(orphans), failed


def _listing(
    store: Store, filters: JobFilter, trusted_keys: list[KeyLike] | None, *, lenient_text: bool
) -> tuple[list[str], list[VerificationResult], dict[str, list[Misplaced]]]:
    """The ids of the jobs ``filters`` select, in listing order, and — without a filter — the
    verified orphans and the event rows no read of their job's log returns, all read in one
    snapshot."""
    unfiltered = not filters.status and filters.namespace is None and filters.plan_name is None
    with collector_paused(), store.snapshot(lenient_text=lenient_text) as snap:
        # only the ids are read: a job row edited outside the store is listed (and fails its
        # checks); one query, streamed
        job_ids = list(snap.iter_job_ids(filters))
        orphans = orphan_results(snap, trusted_keys=trusted_keys) if unfiltered else []
        misplaced = misplaced_events(snap) if unfiltered else {}
    return job_ids, orphans, misplaced
