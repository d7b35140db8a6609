"""``Store.create_jobs``, on both backends: a batch of jobs created in one transaction (all or
none), found again by their keys in order, each with its first events, parent link and queue;
on PostgreSQL two round trips for the batch."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from affidavit.core.errors import StoreError
from affidavit.store import JobFilter, NewEvent, NewJob, Store, open_store
from affidavit.store.queues import Placement, queue_config, queue_stats, set_queue
from tests.conftest import PG_URL, with_schema


def batch(parent: str, n: int, **extra: Any) -> list[NewJob]:
    return [
        NewJob(
            plan_name="child",
            idempotency_key=f"child:{parent}:{i}",
            events=[NewEvent("job_created", {"i": i}), NewEvent("agent_started", {"i": i})],
            parent=(parent, f"{parent}:#{i}"),
            **extra,
        )
        for i in range(n)
    ]


def test_a_batch_is_created_once_with_its_first_events_and_links(store: Store) -> None:
    parent, _ = store.create_job(events=[NewEvent("job_created", {})])
    made = store.create_jobs(batch(parent.job_id, 5), durable=False)
    assert [created for _, created in made] == [True] * 5
    for i, (job, _) in enumerate(made):
        events = store.list_events(job.job_id)
        assert [e.payload for e in events] == [{"i": i}, {"i": i}]
        assert (job.version, job.head_hash) == (2, events[-1].chain_hash)
        assert store.get_job(job.job_id).head_hash == job.head_hash
        assert store.job_parent(job.job_id) == parent.job_id
    again = store.create_jobs(batch(parent.job_id, 6))
    assert [j.job_id for j, _ in again[:5]] == [j.job_id for j, _ in made]
    assert [created for _, created in again] == [False] * 5 + [True]
    assert len(store.list_jobs(JobFilter(parent=parent.job_id))) == 6


def test_a_batch_with_a_job_that_cannot_be_created_creates_none(store: Store) -> None:
    parent, _ = store.create_job(events=[NewEvent("job_created", {})])
    jobs = batch(parent.job_id, 3)
    jobs[2] = NewJob(job_id=parent.job_id, events=[NewEvent("job_created", {})])  # (taken)
    with pytest.raises(StoreError, match="already exists"):
        store.create_jobs(jobs)
    assert store.list_jobs(JobFilter(parent=parent.job_id)) == []
    assert len(store.list_jobs()) == 1


def test_a_batch_puts_each_job_in_its_queue(store: Store) -> None:
    parent, _ = store.create_job(events=[NewEvent("job_created", {})])
    refunds = set_queue(store, queue_config("refunds", concurrency=2))
    store.create_jobs(batch(parent.job_id, 2, placement=Placement("refunds")))
    store.create_jobs(batch("other", 1))
    assert queue_stats(store, refunds, time.time())["pending"] == 2


@pytest.fixture
def pg_store(pg_schema: str) -> Iterator[Store]:
    store = open_store(with_schema(PG_URL, pg_schema))
    yield store
    store.close()


def test_a_batch_is_two_round_trips_on_postgresql(
    pg_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, _ = pg_store.create_job(events=[NewEvent("job_created", {})])
    pg_store.create_jobs(batch("warm", 1))  # (its statements prepared)
    sent: list[str] = []
    real = psycopg.ClientCursor.execute

    def execute(self: psycopg.ClientCursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.ClientCursor, "execute", execute)
    made = pg_store.create_jobs(batch(parent.job_id, 50), durable=False)
    assert all(created for _, created in made)
    assert len([m for m in sent if not m.startswith("PREPARE ")]) == 2
    sent.clear()
    pg_store.create_jobs(batch("single", 1))  # (a single job: two as well)
    assert len([m for m in sent if not m.startswith("PREPARE ")]) == 2
