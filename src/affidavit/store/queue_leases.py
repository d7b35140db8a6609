"""Renewing a lease that already expired, for a job of a named queue: within the queue's
limits only.

A lease that expired holds no slot of its queue (see :mod:`affidavit.store.queues`): once it
has, a claim may have given the slot to another job. A heartbeat that comes late and simply
extended the lease would make the job hold a slot again that nobody granted — one job over the
queue's ``concurrency`` until the next hand-off. So a late renewal is a claim of its own: under
the queue's lock, the limits are counted as a claim counts them (``concurrency``,
``worker_concurrency``, one running job per partition); the lease is extended only if they
allow it, else the attempt has lost its hold (the heartbeat reports the lease lost, and the job
is claimed again like any job whose lease expired). A rate is not counted: a renewal starts
nothing.
"""

from __future__ import annotations

from affidavit.store.base import Transaction
from affidavit.store.queues import get_config_for_update, live_counts, partition_taken


def renew_expired(
    tx: Transaction, job_id: str, attempt_id: str, expires_at: float, now: float
) -> bool:
    """Extend ``attempt_id``'s expired lease on ``job_id`` to ``expires_at`` if the job's queue
    has room for it at ``now`` (see the module's text); ``False`` if it has none, or the
    attempt no longer holds the job. A job of the default queue (or of a queue with no
    configuration: nothing limits it) is renewed as any heartbeat renews."""
    rows = tx.query(
        "SELECT queue, partition_key, lease_owner FROM jobs WHERE job_id = ? AND attempt_id = ? "
        "AND status = 'running'",
        (job_id, attempt_id),
    )
    if not rows:
        return False
    queue, partition_key, owner = rows[0]
    config = None if queue is None else get_config_for_update(tx, str(queue))
    if config is not None:
        running, mine, _ = live_counts(tx, config, str(owner or ""), now)
        if config.concurrency is not None and running >= config.concurrency:
            return False
        if config.worker_concurrency is not None and mine >= config.worker_concurrency:
            return False
        if (
            config.partitioned
            and partition_key is not None
            and partition_taken(tx, config.name, str(partition_key), job_id, now)
        ):
            return False
    renewed = tx.query(
        "UPDATE jobs SET lease_expires_at = ? WHERE job_id = ? AND attempt_id = ? "
        "AND status = 'running' RETURNING job_id",
        (expires_at, job_id, attempt_id),
    )
    return bool(renewed)
