"""The end of each queue grant, recorded by the database whatever ends the hold, and
``affidavit verify --queue Q --since T`` over the recorded grants, on both backends.

Times are real (the database's clock records an end, the claimant's the claim): each claim
here is made at the real time, or before it for a lease that expired."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from affidavit.core.errors import MigrationError
from affidavit.core.rates import Rate, peak_overlap, window_starts, worst_window
from affidavit.store import Store, open_store
from affidavit.store.queue_grants import job_queue_claims, queue_grants
from affidavit.store.queues import Placement, claim_from_queue, queue_config, set_queue
from affidavit.verify.queue_limits import verify_queue
from tests.cli.test_cli import cli, json_of
from tests.store.legacy import undo_migration_21

LEASE = 30.0


def submit(store: Store, queue: str) -> str:
    job, _ = store.create_job(plan_name="p", placement=Placement(queue))
    return job.job_id


def claim(store: Store, queue: str, now: float, attempt: str, owner: str = "w1") -> str:
    claimed = claim_from_queue(
        store, queue, owner=owner, attempt_id=attempt, now=now, lease_seconds=LEASE
    )
    assert claimed is not None
    return claimed.job_id


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def ends(store: Store, queue: str) -> dict[str, tuple[float | None, str]]:
    return {
        g.attempt_id: (g.end, g.ended_as) for g in queue_grants(store, queue, 0, 0, time.time())
    }


def test_every_way_a_hold_ends_is_recorded(store: Store) -> None:
    set_queue(store, queue_config("q", concurrency=10))
    done, waits, parked, handed, taken, held = (submit(store, "q") for _ in range(6))
    before = time.time()
    for job, attempt in [(done, "a1"), (waits, "a2"), (parked, "a3"), (handed, "a4")]:
        assert claim(store, "q", before, attempt) == job
    # a lease that expired 20 s ago, then taken over by a claim now
    assert claim(store, "q", before - LEASE - 20, "a5") == taken
    assert claim(store, "q", before, "a6") == taken
    assert claim(store, "q", before, "a7") == held
    with store.transaction() as tx:
        tx.set_status(done, status="completed", fence="a1")
    with store.transaction() as tx:
        tx.set_status(waits, status="waiting", fence="a2")
        tx.set_lease(waits, attempt_id=None, owner=None, expires_at=None)
    with store.transaction() as tx:
        tx.set_status(parked, status="parked", fence="a3")
        tx.set_lease(parked, attempt_id=None, owner=None, expires_at=None)
    with store.transaction() as tx:
        assert tx.release_lease(handed, "a4", time.time())
    after = time.time()
    got = ends(store, "q")
    for attempt, how in [("a1", "completed"), ("a2", "waiting"), ("a3", "parked")]:
        end, ended_as = got[attempt]
        assert ended_as == how and end is not None and before - 1 <= end <= after + 1
    assert got["a4"][1] == "released"
    assert got["a5"] == (before - 20, "lease_expired")  # its lease's expiry, not the takeover
    assert got["a6"] == (got["a6"][0], "held") and got["a7"][1] == "held"
    # a job of the default queue records nothing, and its ends touch no grant
    plain, _ = store.create_job(plan_name="p")
    assert job_queue_claims(store, plain.job_id, time.time()) == []
    claims = job_queue_claims(store, taken, time.time())
    assert [(c["queue"], c["attempt_id"], c["started"], c["ended_as"]) for c in claims] == [
        ("q", "a5", True, "lease_expired"),
        ("q", "a6", False, "held"),
    ]
    assert claims[1]["ended_at"] is None


def test_a_forged_grant_violates_and_a_kept_queue_verifies(store_url: str) -> None:
    store = open_store(store_url)
    try:
        set_queue(store, queue_config("v", concurrency=2, worker_concurrency=1, rate="2/60s"))
        since = time.time() - 1
        a, b = submit(store, "v"), submit(store, "v")
        assert claim(store, "v", time.time(), "a", owner="w1") == a
        assert claim(store, "v", time.time(), "b", owner="w2") == b
        ok = cli("verify", "--queue", "v", "--since", iso(since), "--json", "--db", store_url)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        doc = json_of(ok)
        assert doc["ok"] and doc["grants"] == 2 and doc["starts"] == 2
        assert doc["rate"]["worst"] == 2 and sorted(doc["rate"]["job_ids"]) == sorted([a, b])
        assert doc["concurrency"]["worst"] == 2 and doc["worker_concurrency"]["worst"] == 1
        # a third start in the window, by w2 while both claims still run: the rate, the
        # concurrency (three at once) and w2's worker_concurrency are all broken
        t = time.time()
        with store.transaction() as tx:
            tx.execute(
                "INSERT INTO queue_grants (queue, job_id, attempt_id, owner, slot, started, "
                "claimed_at, ended_at, ended_as) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ("v", "forged", "f", "w2", 2, True, t, t + 0.001, "completed"),
            )
    finally:
        store.close()
    bad = cli("verify", "--queue", "v", "--since", iso(since), "--json", "--db", store_url)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    doc = json_of(bad)
    assert not doc["ok"]
    assert (
        doc["rate"]["worst"] == 3 and not doc["rate"]["ok"] and "forged" in doc["rate"]["job_ids"]
    )
    assert doc["concurrency"]["worst"] == 3 and not doc["concurrency"]["ok"]
    worker = doc["worker_concurrency"]
    assert (worker["worker"], worker["worst"], worker["ok"]) == ("w2", 2, False)
    assert sorted(worker["job_ids"]) == sorted([b, "forged"])
    table = cli("verify", "--queue", "v", "--since", iso(since), "--db", store_url)
    assert table.returncode == 1 and "NOT verified" in table.stdout and "forged" in table.stdout
    # from after the forged claim's end: the two real claims still run, within the limits
    later = cli("verify", "--queue", "v", "--since", iso(time.time()), "--db", store_url)
    assert later.returncode == 0, later.stdout


def test_a_claim_without_a_recorded_end_is_unprovable(store: Store) -> None:
    set_queue(store, queue_config("u", concurrency=1))
    job = submit(store, "u")
    assert claim(store, "u", time.time(), "a") == job
    with store.transaction() as tx:  # the job moved on, the end unrecorded (an older schema)
        tx.execute("UPDATE jobs SET attempt_id = NULL WHERE job_id = ?", (job,))
        tx.execute("UPDATE queue_grants SET ended_at = NULL, ended_as = NULL")
    proof = verify_queue(store, "u", time.time() - 60, time.time())
    assert not proof.ok and [g.job_id for g in proof.unknown] == [job]
    assert proof.to_dict()["concurrency"]["unknown_ends"] == 1


@pytest.mark.parametrize(
    "args",
    [
        ("--queue", "q"),  # no --since
        ("--since", "2026-01-01T00:00:00Z"),  # no --queue
        ("--queue", "q", "--since", "yesterday"),
        ("--queue", "q", "--since", "2026-01-01T00:00:00"),  # no zone
        ("--queue", "q", "--since", "2026-01-01T00:00:00Z", "--all"),
        ("--queue", "nope", "--since", "2026-01-01T00:00:00Z"),  # not in the database
        ("--queue", "a b", "--since", "2026-01-01T00:00:00Z"),
    ],
)
def test_bad_input_exits_3(store: Store, store_url: str, args: tuple[str, ...]) -> None:
    result = cli("verify", *args, "--json", "--db", store_url)
    assert result.returncode == 3, result.stdout + result.stderr


def test_windows_and_peaks() -> None:
    rate = Rate(2, 10.0)
    starts = [0.0, 5.0, 10.0, 10.0, 30.0]
    assert worst_window(rate, starts) == (3, 10.0)  # (0, 10] holds 5, 10, 10
    assert window_starts(rate, starts, 10.0) == [1, 2, 3]
    spans: list[tuple[float, float]] = [(0, 10), (10, 20), (5, 15), (12, 13), (3, 3)]
    assert peak_overlap(spans) == (3, 12, [1, 2, 3])  # an end at a start does not overlap it
    assert peak_overlap([]) == (0, None, [])


def test_a_schema_before_recorded_ends_is_read_and_not_proved(store_url: str) -> None:
    """A store opened read-only reads a database without migration 21 (no recorded ends):
    a job's claims are listed without their ends; the queue's concurrency is refused, not
    guessed."""
    store = open_store(store_url)
    try:
        set_queue(store, queue_config("old", concurrency=1))
        job = submit(store, "old")
        claim(store, "old", time.time(), "a")
    finally:
        store.close()
    undo_migration_21(store_url)
    reader = open_store(store_url, read_only=True)
    try:
        claims = job_queue_claims(reader, job, time.time())
        assert [(c["queue"], c["attempt_id"], c["ended_as"]) for c in claims] == [
            ("old", "a", "held")
        ]
        with pytest.raises(MigrationError, match="migration 21"):
            verify_queue(reader, "old", time.time() - 60, time.time())
    finally:
        reader.close()
    result = cli("verify", "--queue", "old", "--since", iso(time.time() - 60), "--db", store_url)
    assert result.returncode == 3


def test_a_slot_handed_on_is_not_held_twice(store: Store) -> None:
    """The next claim's worker read its clock before the lock, the ending job's end was timed
    after that: by the claim times the two holds overlap, by ``held_from`` (the database's
    clock after the lock, the clock of the end) they do not."""
    set_queue(store, queue_config("h", concurrency=1))
    a, b = submit(store, "h"), submit(store, "h")
    since = time.time() - 1
    assert claim(store, "h", time.time(), "a") == a
    read_before_the_lock = time.time()
    time.sleep(0.005)
    with store.transaction() as tx:
        tx.set_status(a, status="completed", fence="a")
    assert claim(store, "h", read_before_the_lock, "b") == b
    (first, second) = queue_grants(store, "h", since, 0, time.time())
    assert first.end is not None and second.claimed_at < first.end <= second.held_from
    proof = verify_queue(store, "h", since, time.time())
    assert proof.concurrency is not None and proof.concurrency.ok
    assert proof.concurrency.worst == 1, proof.to_dict()
