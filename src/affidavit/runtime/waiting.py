"""Waiting for a job that workers run elsewhere: a submitter's side of ``submit``.

A job is *settled* when it will not move without someone: it finished (``completed``,
``failed``, ``cancelled``) or it needs a person (``waiting`` for a signal or approval,
``parked`` for a decision). ``pending`` and ``running`` jobs are waited for — also a running
job whose worker died, which the next worker reclaims once its lease expires.
"""

from __future__ import annotations

import time

from affidavit.core.errors import WaitTimeout
from affidavit.store import JobRecord, Store

SETTLED_STATUSES = ("completed", "failed", "cancelled", "waiting", "parked")
_FIRST_POLL = 0.05


def wait_for_job(
    store: Store,
    job_id: str,
    *,
    timeout: float | None = None,
    poll_seconds: float = 0.5,
) -> JobRecord:
    """Poll ``job_id`` until it is settled (see the module docstring) and return it. Polls
    start at 50 ms and double up to ``poll_seconds``: a short job is seen at once, a long one
    costs one small read per ``poll_seconds``.

    Raises:
        JobNotFound: no such job.
        WaitTimeout: still ``pending`` or ``running`` after ``timeout`` seconds.
        StoreError: the database failed.
    """
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must not be negative")
    if poll_seconds <= 0:
        raise ValueError("poll_seconds must be positive")
    deadline = None if timeout is None else time.monotonic() + timeout
    wait = min(_FIRST_POLL, poll_seconds)
    while True:
        job = store.get_job(job_id)
        if job.status in SETTLED_STATUSES:
            return job
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job, timeout or 0.0)
            time.sleep(min(wait, left))
        else:
            time.sleep(wait)
        wait = min(wait * 2, poll_seconds)
