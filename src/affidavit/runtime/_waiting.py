"""Waiting for a job that workers run elsewhere: a submitter's side of ``submit``.

A job is *settled* when it will not move without someone: it finished (``completed``,
``failed``, ``cancelled``) or it needs a person (``waiting`` for a signal or approval,
``parked`` for a decision). ``pending`` and ``running`` jobs are waited for — also a running
job whose worker died, which the next worker reclaims once its lease expires.
"""

from __future__ import annotations

import logging
import time

from affidavit.core.errors import StoreUnavailable, WaitTimeout
from affidavit.runtime._run_base import DEFAULT_STORE_RETRY_SECONDS
from affidavit.store import JobRecord, Store

log = logging.getLogger(__name__)

SETTLED_STATUSES = ("completed", "failed", "cancelled", "waiting", "parked")
_FIRST_POLL = 0.05


def wait_for_job(
    store: Store,
    job_id: str,
    *,
    timeout: float | None = None,
    poll_seconds: float = 0.5,
    store_retry_seconds: float = DEFAULT_STORE_RETRY_SECONDS,
) -> JobRecord:
    """Poll ``job_id`` until it is settled (see the module docstring) and return it. Polls
    start at 50 ms and double up to ``poll_seconds``: a short job is seen at once, a long one
    costs one small read per ``poll_seconds``. While the database is unavailable (a restart, a
    failover) the wait goes on polling for up to ``store_retry_seconds`` in a row, as workers
    ride out such an outage, warning once per outage.

    Raises:
        JobNotFound: no such job.
        WaitTimeout: still ``pending`` or ``running`` after ``timeout`` seconds (its ``job``
            is the record as last read).
        StoreUnavailable: the database stayed unavailable for ``store_retry_seconds`` (or
            until ``timeout``, before the job could be read once).
        StoreError: the database failed.
    """
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must not be negative")
    if poll_seconds <= 0:
        raise ValueError("poll_seconds must be positive")
    deadline = None if timeout is None else time.monotonic() + timeout
    wait = min(_FIRST_POLL, poll_seconds)
    last: JobRecord | None = None
    outage_since: float | None = None
    while True:
        try:
            job = store.get_job(job_id)
        except StoreUnavailable as exc:
            now = time.monotonic()
            if outage_since is None:
                outage_since = now
                log.warning("waiting for job %s: the database is unavailable (%s)", job_id, exc)
            if now - outage_since >= store_retry_seconds:
                raise
            if deadline is not None and now >= deadline and last is None:
                raise
        else:
            if outage_since is not None:
                log.warning("waiting for job %s: the database is back", job_id)
                outage_since = None
            if job.status in SETTLED_STATUSES:
                return job
            last = job
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                assert last is not None
                raise WaitTimeout(last, timeout or 0.0)
            time.sleep(min(wait, left))
        else:
            time.sleep(wait)
        wait = min(wait * 2, poll_seconds)
