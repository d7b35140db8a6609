"""Cancel requests in the store (migration 17), both backends: the first request stays in force,
and once a job has one the store itself refuses to start anything new in it — a new invocation
(an insert as started, a failed row moved back to started), the job's completion, a wait —
while the outcome of a call in flight is still written, and an insert that meets the key's row
(the in-flight invocation a recovery resolves) is not refused."""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.core.errors import CancelRequestedError
from affidavit.store import NewEvent, Store


def _job(store: Store) -> str:
    job, _ = store.create_job(events=[NewEvent("job_created", {})])
    with store.transaction() as tx:
        tx.set_lease(job.job_id, attempt_id="att", owner="w", expires_at=1.0)
        tx.update_job(job.job_id, status="running")
    return job.job_id


def _insert(tx: Any, job_id: str, key: str, presumed_new: bool = False) -> bool:
    return bool(
        tx.ledger_insert(
            job_id=job_id,
            key=key,
            node_id="n",
            step_id="s",
            tool_name="t",
            args_hash="a",
            invocation_id=f"i-{key}",
            attempt_id="att",
            presumed_new=presumed_new,
        )
    )


def _request(store: Store, job_id: str, reason: str = "stop") -> None:
    with store.transaction() as tx:
        assert tx.get_job(job_id, for_update=True) is not None
        tx.request_cancel(job_id, at="2026-01-01T00:00:00Z", reason=reason, by="ops")


def test_the_first_request_stays_in_force(store: Store) -> None:
    job_id = _job(store)
    with store.transaction() as tx:
        assert tx.cancel_request(job_id) is None
    _request(store, job_id, "first")
    _request(store, job_id, "second")
    with store.transaction() as tx:
        found = tx.cancel_request(job_id)
    assert found is not None and (found.reason, found.by) == ("first", "ops")


@pytest.mark.parametrize("presumed_new", [False, True])
def test_no_new_invocation_starts_after_a_request(store: Store, presumed_new: bool) -> None:
    job_id = _job(store)
    with store.transaction() as tx:
        assert _insert(tx, job_id, "open")  # the call in flight when the cancel came
    _request(store, job_id)
    with pytest.raises(CancelRequestedError), store.transaction() as tx:
        _insert(tx, job_id, "new", presumed_new)
    with store.transaction() as tx:
        assert tx.ledger_get(job_id, "new") is None  # nothing was written
        assert not _insert(tx, job_id, "open")  # meets the open row: refused nothing
        tx.ledger_finish(job_id, "open", status="committed", result={"ok": True})
    with store.transaction() as tx:
        row = tx.ledger_get(job_id, "open")
    assert row is not None and row.status == "committed"  # the outcome is still written


def test_no_new_try_starts_after_a_request(store: Store) -> None:
    job_id = _job(store)
    with store.transaction() as tx:
        _insert(tx, job_id, "k")
        tx.ledger_finish(job_id, "k", status="failed", error={"type": "x"})
    _request(store, job_id)
    with pytest.raises(CancelRequestedError), store.transaction() as tx:
        tx.ledger_restart(job_id, "k", invocation_id="i2", attempt_id="att")
    with store.transaction() as tx:
        row = tx.ledger_get(job_id, "k")
    assert row is not None and row.status == "failed"


@pytest.mark.parametrize("status", ["completed", "waiting"])
def test_a_requested_job_neither_completes_nor_waits(store: Store, status: str) -> None:
    job_id = _job(store)
    _request(store, job_id)
    with pytest.raises(CancelRequestedError), store.transaction() as tx:
        tx.update_job(job_id, status=status)
    assert store.get_job(job_id).status == "running"


@pytest.mark.parametrize("status", ["parked", "failed", "cancelled", "pending"])
def test_a_requested_job_still_parks_fails_and_cancels(store: Store, status: str) -> None:
    job_id = _job(store)
    _request(store, job_id)
    with store.transaction() as tx:
        tx.update_job(job_id, status=status)
    assert store.get_job(job_id).status == status


def test_without_a_request_nothing_is_refused(store: Store) -> None:
    job_id = _job(store)
    other = _job(store)
    _request(store, other)  # another job's request changes nothing here
    with store.transaction() as tx:
        assert _insert(tx, job_id, "k")
        tx.update_job(job_id, status="completed")
    assert store.get_job(job_id).status == "completed"
