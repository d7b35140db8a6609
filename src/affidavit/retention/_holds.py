"""Holds: a job an operator holds (a legal hold, an inquiry) is never removed by retention
while held. A hold is taken under the job row's lock, so it and a removal take turns: either
the removal sees the hold and keeps the job, or the hold finds the job gone and says so."""

from __future__ import annotations

from affidavit.retention._policy import RetentionError
from affidavit.store import Store
from affidavit.store.retention import hold_release, hold_set

MAX_REASON_CHARS = 2000


def hold_job(store: Store, job_id: str, reason: str) -> None:
    """Hold ``job_id`` with ``reason`` (a second hold keeps the first's reason).

    Raises:
        RetentionError: no such job in the live store (perhaps removed already), or a reason
            that is empty or longer than 2,000 characters.
    """
    if not reason.strip() or len(reason) > MAX_REASON_CHARS:
        raise RetentionError(
            f"a hold needs a reason of 1–{MAX_REASON_CHARS} characters",
            hint="Say why the job is held (a case number, an inquiry).",
        )
    with store.transaction() as tx:
        if tx.get_job(job_id, for_update=True) is None:
            raise RetentionError(
                f"no job {job_id} in the live store",
                hint="A job retention removed cannot be held: its pack is in the archive "
                "(`affidavit verify JOB` names it).",
            )
        hold_set(tx, job_id, reason)


def release_job(store: Store, job_id: str) -> bool:
    """Release the hold on ``job_id``; whether it was held."""
    with store.transaction() as tx:
        return hold_release(tx, job_id)
