"""Claims from queues with limits, on both backends: concurrency, worker_concurrency, rate,
priority, partitions, not_before, leases that expire, and the grants each claim records."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from affidavit.core.errors import ConfigError
from affidavit.store import Store, open_store
from affidavit.store.queues import (
    Placement,
    QueueConfig,
    claim_from_queue,
    get_queue,
    list_queues,
    queue_config,
    queue_stats,
    recorded_grants,
    set_queue,
)

LEASE = 30.0


def submit(store: Store, queue: str, **where: Any) -> str:
    job, _ = store.create_job(plan_name="p", placement=Placement(queue, **where))
    return job.job_id


def claim(store: Store, queue: str, now: float, owner: str = "w1", **kw: Any) -> str | None:
    claimed = claim_from_queue(
        store,
        queue,
        owner=owner,
        attempt_id=f"a-{owner}-{now}-{kw.get('tag', '')}",
        now=now,
        lease_seconds=kw.get("lease", LEASE),
    )
    return claimed.job_id if claimed else None


def drain(store: Store, queue: str, now: float, owner: str = "w1") -> list[str]:
    got: list[str] = []
    while (job := claim(store, queue, now, owner, tag=str(len(got)))) is not None:
        got.append(job)
    return got


def test_concurrency_and_lease_expiry(store: Store) -> None:
    set_queue(store, queue_config("llm", concurrency=2))
    jobs = [submit(store, "llm") for _ in range(4)]
    assert drain(store, "llm", 1000.0) == jobs[:2]  # FIFO, two at once
    # the default claim never takes a job of a named queue
    assert store.claim(owner="w", attempt_id="x", now=1000.0, lease_seconds=LEASE) is None
    # a lease that ran out frees its slot: the expired job itself is taken up again first
    again = drain(store, "llm", 1000.0 + LEASE + 1, owner="w2")
    assert again == jobs[:2]
    grants = recorded_grants(store, "llm", 0.0)
    assert [(g["job_id"], g["slot"], g["started"]) for g in grants] == [
        (jobs[0], 0, True),
        (jobs[1], 1, True),
        (jobs[0], 0, False),
        (jobs[1], 1, False),
    ]


def test_finished_and_waiting_jobs_hold_no_slot(store: Store) -> None:
    set_queue(store, queue_config("q", concurrency=1))
    a, b, c = (submit(store, "q") for _ in range(3))
    assert drain(store, "q", 10.0) == [a]
    with store.transaction() as tx:
        tx.execute("UPDATE jobs SET status = 'completed' WHERE job_id = ?", (a,))
    assert drain(store, "q", 11.0) == [b]
    with store.transaction() as tx:  # b waits (a timer at 20): its slot is free meanwhile
        tx.execute(
            "UPDATE jobs SET status = 'waiting', lease_owner = NULL, lease_expires_at = 20 "
            "WHERE job_id = ?",
            (b,),
        )
    assert drain(store, "q", 12.0) == [c]
    assert drain(store, "q", 30.0) == []  # b's timer is due, but c holds the one slot
    with store.transaction() as tx:
        tx.execute("UPDATE jobs SET status = 'completed' WHERE job_id = ?", (c,))
    assert drain(store, "q", 31.0) == [b]  # resumed: takes a slot again, not a new start
    assert [g["started"] for g in recorded_grants(store, "q", 0.0)] == [True, True, True, False]


def test_worker_concurrency(store: Store) -> None:
    set_queue(store, queue_config("q", concurrency=3, worker_concurrency=2))
    jobs = [submit(store, "q") for _ in range(4)]
    assert drain(store, "q", 10.0, owner="w1") == jobs[:2]
    assert drain(store, "q", 10.0, owner="w2") == jobs[2:3]  # the queue's 3 are running


def test_rate_is_a_sliding_window(store: Store) -> None:
    set_queue(store, queue_config("r", rate="2/10s"))
    jobs = [submit(store, "r") for _ in range(5)]
    assert drain(store, "r", 100.0) == jobs[:2]
    assert drain(store, "r", 105.0) == []
    assert drain(store, "r", 109.9) == []  # the window (99.9, 109.9] still holds both
    assert drain(store, "r", 110.0) == jobs[2:4]  # (100, 110]: empty
    starts = [g["claimed_at"] for g in recorded_grants(store, "r", 0.0) if g["started"]]
    assert starts == [100.0, 100.0, 110.0, 110.0]


def test_priority_lowest_first_fifo_within(store: Store) -> None:
    set_queue(store, queue_config("p", priority=True))
    low = submit(store, "p", priority=5)
    high1 = submit(store, "p", priority=1)
    high2 = submit(store, "p", priority=1)
    neg = submit(store, "p", priority=-3)
    assert drain(store, "p", 10.0) == [neg, high1, high2, low]


def test_priority_ignored_without_priority_flag(store: Store) -> None:
    set_queue(store, queue_config("f"))
    first = submit(store, "f", priority=9)
    second = submit(store, "f", priority=1)
    assert drain(store, "f", 10.0) == [first, second]


def test_partitioned_one_running_per_key_in_order(store: Store) -> None:
    set_queue(store, queue_config("refunds", partitioned=True, priority=True))
    a1 = submit(store, "refunds", partition_key="a")
    a2 = submit(store, "refunds", partition_key="a", priority=-1)  # no overtaking within a key
    b1 = submit(store, "refunds", partition_key="b")
    free = submit(store, "refunds")
    assert sorted(drain(store, "refunds", 10.0)) == sorted([a1, b1, free])
    with store.transaction() as tx:
        tx.execute("UPDATE jobs SET status = 'completed' WHERE job_id = ?", (a1,))
    assert drain(store, "refunds", 11.0) == [a2]


def test_not_before(store: Store) -> None:
    set_queue(store, queue_config("later"))
    job = submit(store, "later", not_before=500.0)
    assert drain(store, "later", 499.0) == []
    assert drain(store, "later", 500.0) == [job]


def test_unknown_queue_claims_nothing(store: Store) -> None:
    submit(store, "nowhere")
    assert drain(store, "nowhere", 10.0) == []


def test_configuration_and_declarations(store: Store) -> None:
    config = queue_config(
        "llm", concurrency=8, worker_concurrency=2, rate="100/60s", priority=True, partitioned=True
    )
    set_queue(store, config, replace=False)
    set_queue(store, config, replace=False)  # the same declaration again: fine
    assert get_queue(store, "llm") == config
    with pytest.raises(ConfigError, match="configured otherwise"):
        set_queue(store, queue_config("llm", concurrency=9), replace=False)
    set_queue(store, queue_config("llm", concurrency=9))  # `queues set` replaces
    assert list_queues(store) == [QueueConfig("llm", concurrency=9)]
    stats = queue_stats(store, get_queue(store, "llm") or config, 0.0)
    assert (stats["pending"], stats["running"], stats["concurrency"]) == (0, 0, 9)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrency": 0},
        {"concurrency": True},
        {"worker_concurrency": -1},
        {"rate": "5"},
        {"rate": "0/1s"},
        {"concurrency": 10**7},
    ],
)
def test_bad_configuration_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        queue_config("q", **kwargs)


@pytest.mark.parametrize("name", ["", "default", "-x", "a b", "x" * 200, "é"])
def test_bad_names_refused(name: str) -> None:
    with pytest.raises(ConfigError):
        queue_config(name)


def test_concurrent_claimers_never_take_one_more(store_url: str) -> None:
    """Eight claimers at once, each with a store of its own (its own connections), on a queue
    of concurrency 3 and 20 jobs: exactly 3 are running afterwards (read from the jobs)."""
    setup = open_store(store_url)
    try:
        set_queue(setup, queue_config("race", concurrency=3))
        for _ in range(20):
            submit(setup, "race")
    finally:
        setup.close()
    barrier = threading.Barrier(8)
    taken: list[str] = []

    def claimer(k: int) -> None:
        store = open_store(store_url)
        try:
            barrier.wait()
            for i in range(5):
                got = claim(store, "race", 1000.0, owner=f"w{k}", tag=str(i))
                if got is not None:
                    taken.append(got)
        finally:
            store.close()

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check = open_store(store_url)
    try:
        with check.transaction() as tx:
            (running,) = tx.query(
                "SELECT count(*) FROM jobs WHERE queue = 'race' AND status = 'running'"
            )[0]
    finally:
        check.close()
    assert int(running) == 3
    assert len(taken) == 3


def _claim_as(store: Store, queue: str, attempt: str, now: float, owner: str = "w1") -> str:
    claimed = claim_from_queue(
        store, queue, owner=owner, attempt_id=attempt, now=now, lease_seconds=LEASE
    )
    assert claimed is not None
    return claimed.job_id


def _heartbeat(store: Store, job_id: str, attempt: str, now: float) -> bool:
    with store.transaction() as tx:
        return tx.heartbeat(job_id, attempt, now + LEASE, now)


@pytest.mark.parametrize(
    ("config", "where", "second_owner"),
    [
        ({"concurrency": 1}, {}, "w2"),
        ({"worker_concurrency": 1}, {}, "w1"),
        ({"partitioned": True}, {"partition_key": "customer-7"}, "w2"),
    ],
    ids=["concurrency", "worker_concurrency", "partition"],
)
def test_an_expired_lease_is_renewed_only_within_the_queues_limits(
    store: Store, config: dict[str, Any], where: dict[str, Any], second_owner: str
) -> None:
    """A heartbeat that comes after its lease expired, once the slot went to another job, does
    not take the slot back: the queue would run one job over its limit."""
    set_queue(store, queue_config("q", **config))
    first, second = submit(store, "q", **where), submit(store, "q", **where)
    assert _claim_as(store, "q", "a1", 1000.0) == first
    assert _heartbeat(store, first, "a1", 1010.0)  # live: renewed to 1040
    late = 1040.0 + 1  # the lease ran out; the other job takes the slot
    with store.transaction() as tx:  # the first job's attempt must not be the one taken up
        tx.execute("UPDATE jobs SET not_before = ? WHERE job_id = ?", (late + 100, first))
    assert _claim_as(store, "q", "a2", late, owner=second_owner) == second
    assert not _heartbeat(store, first, "a1", late + 1)
    assert store.get_job(first).lease_expires_at == pytest.approx(1040.0)
    with store.transaction() as tx:  # the other job ends: now there is room again
        tx.execute("UPDATE jobs SET status = 'completed' WHERE job_id = ?", (second,))
    assert _heartbeat(store, first, "a1", late + 2)
    assert store.get_job(first).lease_expires_at == pytest.approx(late + 2 + LEASE)


def test_an_expired_lease_outside_named_queues_is_renewed(store: Store) -> None:
    """Nothing limits the default queue (nor a queue with no configuration): a late heartbeat
    renews the lease as a timely one does."""
    job_id, _ = store.create_job(plan_name="p")
    with store.transaction() as tx:
        assert tx.claim(owner="w1", attempt_id="a1", now=1000.0, lease_seconds=LEASE)
    assert _heartbeat(store, job_id.job_id, "a1", 1100.0)
    assert store.get_job(job_id.job_id).lease_expires_at == pytest.approx(1100.0 + LEASE)
    assert not _heartbeat(store, job_id.job_id, "other", 1101.0)
    unconfigured = submit(store, "nowhere")
    with store.transaction() as tx:
        tx.execute(
            "UPDATE jobs SET status = 'running', attempt_id = 'a3', lease_owner = 'w1', "
            "lease_expires_at = 10 WHERE job_id = ?",
            (unconfigured,),
        )
    assert _heartbeat(store, unconfigured, "a3", 50.0)
