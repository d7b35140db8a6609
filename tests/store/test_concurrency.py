"""Concurrent appenders: threads and real processes, one job and many jobs, both backends.

Whatever the interleaving, a job's log must have versions 1..n with no gap or duplicate, every
acknowledged append present exactly once, and a chain that recomputes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from affidavit.core.chain import check_stored_chain
from affidavit.core.errors import ConflictError
from affidavit.store import NewEvent, Store, open_store

APPENDER = Path(__file__).with_name("appender.py")


def assert_log_intact(store: Store, job_id: str, expected: Counter[tuple[str, int]]) -> None:
    events = store.list_events(job_id)
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    seen = Counter((e.payload["worker"], e.payload["i"]) for e in events)
    assert seen == expected
    check = check_stored_chain(
        (e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash) for e in events
    )
    assert check.ok, f"chain broken at version {check.first_bad_version}"
    assert store.get_job(job_id).head_hash == check.root


def append_with_retry(store: Store, job_id: str, worker: str, count: int) -> int:
    conflicts = 0
    for i in range(count):
        while True:
            version = store.get_job(job_id).version
            try:
                store.append(
                    job_id,
                    [NewEvent("node_started", {"worker": worker, "i": i})],
                    expected_version=version,
                    durable=False,
                )
                break
            except ConflictError:
                conflicts += 1
    return conflicts


def test_threads_append_to_one_job(store: Store) -> None:
    job, _ = store.create_job()
    workers, per = 6, 40
    conflicts: list[int] = []
    threads = [
        threading.Thread(
            target=lambda w=w: conflicts.append(append_with_retry(store, job.job_id, f"t{w}", per))
        )
        for w in range(workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(conflicts) == workers
    expected = Counter((f"t{w}", i) for w in range(workers) for i in range(per))
    assert_log_intact(store, job.job_id, expected)


def test_processes_append_to_one_job(store: Store, store_url: str) -> None:
    job, _ = store.create_job()
    workers, per = 3, 40
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    procs = [
        subprocess.Popen(
            [sys.executable, str(APPENDER), store_url, job.job_id, f"p{w}", str(per)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for w in range(workers)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip().isdigit()
    expected = Counter((f"p{w}", i) for w in range(workers) for i in range(per))
    assert_log_intact(store, job.job_id, expected)


def test_many_jobs_in_parallel(store: Store) -> None:
    jobs = [store.create_job()[0].job_id for _ in range(8)]
    per = 25

    def run(job_id: str) -> None:
        for i in range(per):
            store.append(
                job_id, [NewEvent("node_started", {"worker": job_id, "i": i})], expected_version=i
            )

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for j in jobs:
        assert_log_intact(store, j, Counter((j, i) for i in range(per)))


def test_a_waiting_writer_proceeds_after_the_holder_commits(store: Store, store_url: str) -> None:
    """A second store (as in another process) blocks on the same job while the first holds its
    transaction open, then appends on top of the committed head — never beside it."""
    job, _ = store.create_job()
    other = open_store(store_url)
    try:
        entered = threading.Event()
        release = threading.Event()
        result: dict[str, object] = {}

        def holder() -> None:
            with store.transaction() as tx:
                tx.append(
                    job.job_id,
                    [NewEvent("node_started", {"worker": "a", "i": 0})],
                    expected_version=0,
                )
                # a read sends any batched writes (PostgreSQL), so the job is locked from here
                held = tx.get_job(job.job_id)
                assert held is not None and held.version == 1
                entered.set()
                release.wait(10)

        def contender() -> None:
            entered.wait(10)
            try:
                other.append(
                    job.job_id,
                    [NewEvent("node_started", {"worker": "b", "i": 0})],
                    expected_version=0,
                )
            except ConflictError as exc:
                result["conflict"] = exc.actual
            result["done_at"] = time.monotonic()

        t1 = threading.Thread(target=holder)
        t2 = threading.Thread(target=contender)
        t1.start()
        t2.start()
        entered.wait(10)
        time.sleep(0.3)  # give the contender time to reach the lock
        assert "done_at" not in result  # it is waiting, not writing beside the holder
        released_at = time.monotonic()
        release.set()
        t1.join()
        t2.join()
        assert result["conflict"] == 1  # it saw the committed head, so expected 0 is stale
        assert float(result["done_at"]) >= released_at  # type: ignore[arg-type]
    finally:
        other.close()
    assert_log_intact(store, job.job_id, Counter({("a", 0): 1}))


def test_postgres_locks_per_job_not_globally(pg_schema: str) -> None:
    """PostgreSQL only (SQLite has one writer per database by design): while one transaction
    holds job A's row, an append to job B commits."""
    from tests.conftest import PG_URL, with_schema

    store = open_store(with_schema(PG_URL, pg_schema))
    try:
        a = store.create_job()[0].job_id
        b = store.create_job()[0].job_id
        entered, release = threading.Event(), threading.Event()

        def holder() -> None:
            with store.transaction() as tx:
                tx.append(
                    a, [NewEvent("node_started", {"worker": "a", "i": 0})], expected_version=0
                )
                job_a = tx.get_job(a)  # a read sends the batched writes: A is locked from here
                assert job_a is not None and job_a.version == 1
                entered.set()
                release.wait(10)

        t = threading.Thread(target=holder)
        t.start()
        assert entered.wait(10)
        done = threading.Event()

        def other() -> None:
            store.append(b, [NewEvent("node_started", {"worker": "b", "i": 0})], expected_version=0)
            done.set()

        blocked_on_a = threading.Event()

        def contender_on_a() -> None:
            with contextlib.suppress(ConflictError):
                store.append(
                    a, [NewEvent("node_started", {"worker": "c", "i": 0})], expected_version=0
                )
            blocked_on_a.set()

        t2 = threading.Thread(target=other)
        t3 = threading.Thread(target=contender_on_a)
        t2.start()
        t3.start()
        committed_while_held = done.wait(5)
        a_was_blocked = not blocked_on_a.wait(0.5)  # A itself stays locked meanwhile
        release.set()
        t.join()
        t2.join()
        t3.join()
        assert committed_while_held
        assert a_was_blocked
    finally:
        store.close()
