"""Following a job's log while it runs: the events after a version, as they are recorded, until
the job ends — the one reader behind ``affidavit jobs watch`` and ``GET /api/jobs/{id}/stream``.

A poll reads the events after the last one it returned, then the job row: the row's version
and status are written in the transaction of the event that changed them, so when the row's
version is the last one read, the status is the status after those events — a follower that
ends on it has missed nothing.
"""

from __future__ import annotations

import time
from collections.abc import Generator

from affidavit.store import Store, StoredEvent

#: The statuses a follower always ends at, and those it ends at only when asked to.
FINISHED = ("completed", "failed", "cancelled")
NEEDS_SOMEONE = ("waiting", "parked")
_BATCH = 500
_FIRST_POLL = 0.02  # seconds: a value is read this soon after it is recorded while others come
_MAX_POLL = 0.2  # and at most this late once the job is quiet


class JobFollower:
    """Reads one job's log a poll at a time, from ``after_version`` on.

    ``until_settled``: end when the job waits for a signal or a person or is parked, as well
    as when it is finished.
    """

    def __init__(
        self, store: Store, job_id: str, after_version: int = 0, *, until_settled: bool
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.version = after_version
        self.ends_at = FINISHED + NEEDS_SOMEONE if until_settled else FINISHED
        self.status: str | None = None  # the status the job ended in, once it did

    def poll(self) -> list[StoredEvent]:
        """The events recorded since the last poll (at most a batch), in version order; sets
        :attr:`status` when the job reached a status it ends at and nothing is left to read.

        Raises:
            JobNotFound: no such job.
            StoreError: the database failed.
        """
        events = self.store.list_events(self.job_id, after_version=self.version, limit=_BATCH)
        if events:
            self.version = events[-1].version
            if len(events) == _BATCH:
                return events
        job = self.store.get_job(self.job_id)
        if job.version <= self.version and job.status in self.ends_at:
            self.status = job.status
        return events


def follow_job(
    store: Store,
    job_id: str,
    after_version: int = 0,
    *,
    until_settled: bool = True,
    timeout: float | None = None,
) -> Generator[StoredEvent, None, str | None]:
    """Every event of ``job_id`` after ``after_version`` as it is recorded, until the job ends
    (see :class:`JobFollower`) or ``timeout`` seconds passed; the follower's :attr:`status`
    is in the generator's return value (``None`` after a timeout). Polls 20 ms apart while
    events come, backing off to 200 ms while the job is quiet.

    Raises:
        JobNotFound: no such job.
        StoreError: the database failed.
    """
    follower = JobFollower(store, job_id, after_version, until_settled=until_settled)
    deadline = None if timeout is None else time.monotonic() + timeout
    wait = _FIRST_POLL
    while True:
        events = follower.poll()
        yield from events
        if follower.status is not None:
            return follower.status
        if deadline is not None and time.monotonic() >= deadline:
            return None
        wait = next_wait(wait, bool(events))
        time.sleep(wait)


def next_wait(wait: float, got_events: bool) -> float:
    """The pause before the next poll (for a caller that sleeps its own way)."""
    return _FIRST_POLL if got_events else min(wait * 2, _MAX_POLL)
