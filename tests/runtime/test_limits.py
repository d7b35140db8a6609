"""Tool limits across workers (``@tool(..., limit=Limit(...))``) on SQLite and PostgreSQL:
every limit is checked from the grants and finishes recorded in the jobs' logs, not from the
limiter's own counters; a dead claim's grant ends with its lease."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from affidavit import Limit, Runtime, Store, Tool, ToolContext, ToolRegistry
from affidavit.core.errors import ConfigError
from affidavit.core.times import parse_iso_us
from affidavit.store import StoredEvent
from tests.runtime.helpers import assert_log_sound, node, plan


def grants_and_ends(events: list[StoredEvent]) -> list[tuple[int, int]]:
    """(granted, finished) in µs of every limited call in ``events``, from the record."""
    started: dict[str, int] = {}
    spans = []
    for e in events:
        p = e.payload
        if e.type == "tool_invocation_started" and "limit_grant" in p:
            started[p["invocation_id"]] = parse_iso_us(p["limit_grant"]["granted_at"])
        elif e.type == "tool_invocation_finished" and p["invocation_id"] in started:
            spans.append((started.pop(p["invocation_id"]), parse_iso_us(p["at"])))
    assert not started, "every limited call finished"
    return spans


def most_at_once(spans: list[tuple[int, int]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    worst = now = 0
    for _, step in edges:
        now += step
        worst = max(worst, now)
    return worst


def most_in_window(times: list[int], period_us: int) -> int:
    times = sorted(times)
    worst, first = 0, 0
    for i, t in enumerate(times):
        while times[first] <= t - period_us:
            first += 1
        worst = max(worst, i - first + 1)
    return worst


class Calls:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.peak = self.count = 0

    def run(self, ctx: ToolContext, seconds: float) -> str:
        with self.lock:
            self.running += 1
            self.count += 1
            self.peak = max(self.peak, self.running)
        time.sleep(seconds)
        with self.lock:
            self.running -= 1
        return ctx.node_id


def fan(n: int, seconds: float) -> dict[str, Any]:
    return plan(*(node(f"n{i}", "chat", args={"seconds": seconds}) for i in range(n)))


def run_workers(url: str, tools: ToolRegistry, workers: int, concurrency: int) -> None:
    """``workers`` runtimes (each its own connections, as separate workers) until idle."""

    def work() -> None:
        with Runtime(url, tools=tools, step_concurrency=concurrency) as rt:
            rt.run_until_idle()

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_concurrency_holds_across_workers(store_url: str, store: Store) -> None:
    calls = Calls()
    tools = ToolRegistry([Tool("chat", calls.run, "tool", limit=Limit(concurrency=2))])
    with Runtime(store_url, tools=tools) as rt:
        jobs = [rt.submit(fan(4, 0.05), {}).job_id for _ in range(3)]
    run_workers(store_url, tools, workers=3, concurrency=4)
    spans: list[tuple[int, int]] = []
    for job_id in jobs:
        assert store.get_job(job_id).status == "completed"
        spans += grants_and_ends(assert_log_sound(store, job_id))
    assert len(spans) == calls.count == 12  # every call once
    assert most_at_once(spans) <= 2
    assert 1 <= calls.peak <= 2  # never three at once (two together is likely, not certain)


def test_rate_holds_across_workers(store_url: str, store: Store) -> None:
    calls = Calls()
    tools = ToolRegistry([Tool("chat", calls.run, "tool", limit=Limit(rate="3/300ms"))])
    with Runtime(store_url, tools=tools) as rt:
        jobs = [rt.submit(fan(3, 0.0), {}).job_id for _ in range(3)]
    t0 = time.monotonic()
    run_workers(store_url, tools, workers=3, concurrency=3)
    took = time.monotonic() - t0
    granted = []
    for job_id in jobs:
        assert store.get_job(job_id).status == "completed"
        granted += [a for a, _ in grants_and_ends(assert_log_sound(store, job_id))]
    assert len(granted) == 9
    assert most_in_window(granted, 300_000) <= 3
    assert max(granted) - min(granted) >= 600_000  # nine starts at 3 per 300 ms span 600 ms
    assert took >= 0.6


NO_CALLS = ToolRegistry([Tool("chat", Calls().run, "tool")])


def _running_job(store: Store, rt: Runtime) -> tuple[str, str]:
    job_id = rt.submit(fan(1, 0.0), {}).job_id
    attempt = uuid.uuid4().hex
    claimed = store.claim(
        owner="w", attempt_id=attempt, now=time.time(), lease_seconds=30, job_id=job_id
    )
    assert claimed is not None
    return job_id, attempt


def _take(store: Store, job_id: str, attempt: str, **limit: Any) -> int | None:
    with store.transaction() as tx:
        return tx.limit_take(
            "x",
            grant_id=uuid.uuid4().hex,
            job_id=job_id,
            attempt_id=attempt,
            clock=lambda: time.time_ns() // 1000,
            rate=limit.get("rate"),
            concurrency=limit.get("concurrency"),
        ).granted_us


def test_a_dead_claims_grant_ends_with_its_lease(store_url: str, store: Store) -> None:
    with Runtime(store_url, tools=NO_CALLS) as rt:
        a, attempt_a = _running_job(store, rt)
        b, attempt_b = _running_job(store, rt)
    assert _take(store, a, attempt_a, concurrency=1) is not None
    assert _take(store, b, attempt_b, concurrency=1) is None  # a holds the only slot
    with store.transaction() as tx:  # a's worker died: its lease runs out
        tx.execute("UPDATE jobs SET lease_expires_at = 0 WHERE job_id = ?", (a,))
    assert _take(store, b, attempt_b, concurrency=1) is not None
    # another worker claims a: the old claim takes nothing any more, the new one does
    again = uuid.uuid4().hex
    assert store.claim(owner="w2", attempt_id=again, now=time.time(), lease_seconds=30, job_id=a)
    assert _take(store, a, attempt_a, concurrency=5) is None
    assert _take(store, a, again, concurrency=5) is not None


def test_released_grants_free_their_slot_and_stay_counted_in_the_window(
    store_url: str, store: Store
) -> None:
    with Runtime(store_url, tools=NO_CALLS) as rt:
        a, attempt_a = _running_job(store, rt)
    first = uuid.uuid4().hex
    with store.transaction() as tx:
        taken = tx.limit_take(
            "x",
            grant_id=first,
            job_id=a,
            attempt_id=attempt_a,
            clock=lambda: time.time_ns() // 1000,
            rate=(2, 60_000_000),
            concurrency=1,
        )
        assert taken.granted_us is not None
    assert _take(store, a, attempt_a, rate=(2, 60_000_000), concurrency=1) is None
    with store.transaction() as tx:
        tx.limit_release(first, at_us=time.time_ns() // 1000)
    assert _take(store, a, attempt_a, rate=(2, 60_000_000), concurrency=1) is not None
    assert _take(store, a, attempt_a, rate=(2, 60_000_000)) is None  # two in the minute
    with store.transaction() as tx:
        (usage,) = tx.limit_usage(now_us=time.time_ns() // 1000)
    assert (usage.name, usage.in_flight, usage.in_window) == ("x", 1, 2)


def test_limit_options_are_checked_where_they_are_written() -> None:
    with pytest.raises(ConfigError, match="rate"):
        Limit(rate="fast")
    with pytest.raises(ConfigError, match="concurrency"):
        Limit(concurrency=0)
    with pytest.raises(ConfigError, match="needs"):
        Limit()
    assert Limit(rate="10/1m").rate_us == (10, 60_000_000)


def test_limits_list_shows_each_limits_use(store_url: str, store: Store) -> None:
    import json

    from tests.cli.test_cli import cli

    tools = ToolRegistry([Tool("chat", Calls().run, "tool", limit=Limit(rate="5/1m"))])
    with Runtime(store_url, tools=tools) as rt:
        job_id = rt.submit(fan(2, 0.0), {}).job_id
        rt.run_until_idle()
    assert store.get_job(job_id).status == "completed"
    listed = cli("limits", "list", "--db", store_url, "--json")
    assert listed.returncode == 0, listed.stderr
    (doc,) = json.loads(listed.stdout)
    assert (doc["name"], doc["rate"], doc["in_flight"], doc["started_in_window"]) == (
        "chat",
        "5/60s",
        0,
        2,
    )
    shown = cli("limits", "list", "--db", store_url)
    assert shown.returncode == 0 and "chat" in shown.stdout


def test_a_grant_is_timed_after_the_release_it_counted(store_url: str, store: Store) -> None:
    """A call's finish is timed before its release commits; a taker that counts the slot as
    free must time its grant after that, or the log shows two calls in flight at once."""
    if store_url.startswith("sqlite"):
        pytest.skip("SQLite serializes writers: no release can commit while a take holds the lock")
    with Runtime(store_url, tools=NO_CALLS) as rt:
        a, attempt_a = _running_job(store, rt)
        b, attempt_b = _running_job(store, rt)
    first = uuid.uuid4().hex
    with store.transaction() as tx:
        assert tx.limit_take(
            "x",
            grant_id=first,
            job_id=a,
            attempt_id=attempt_a,
            clock=lambda: time.time_ns() // 1000,
            rate=None,
            concurrency=1,
        ).granted_us
    ended: list[int] = []

    def clock() -> int:
        read = time.time_ns() // 1000
        if not ended:  # a's call ends now: its finish is timed, then its release commits
            ended.append(read + 1_000)
            with store.transaction() as other:
                other.limit_release(first, at_us=ended[0])
            while time.time_ns() // 1000 <= ended[0]:
                time.sleep(0.0005)
        return read

    with store.transaction() as tx:
        taken = tx.limit_take(
            "x",
            grant_id=uuid.uuid4().hex,
            job_id=b,
            attempt_id=attempt_b,
            clock=clock,
            rate=None,
            concurrency=1,
        )
    assert taken.granted_us is not None and taken.granted_us >= ended[0]
