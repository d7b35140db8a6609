"""A database that goes away while a job runs — a restart, a failover, a lock held past the busy
timeout — on SQLite and PostgreSQL: a run keeps trying its writes, so a step whose tool has
acted still gets its record, and a commit that landed although the client was told it failed
is recognized by the job's chain head and never written twice.

Two kinds of fault:

- the real thing: the SQLite write lock held by another connection, a PostgreSQL database
  that refuses connections and has its sessions terminated while a tool runs;
- a dropped connection at one chosen commit (``FlakyStore``): the real store's transaction
  is rolled back ("before") or committed ("after") and then reported as failed, as when the
  connection breaks before COMMIT reaches the server or after the server committed. The
  second cannot be produced on purpose with a real server, so the test places it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import psycopg
import pytest

from affidavit import RetryableError, Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.errors import StoreError, StoreUnavailable
from affidavit.runtime._worker import Worker
from affidavit.store import Store, open_store
from affidavit.store.sqlite import SqliteStore, connect_raw
from affidavit.verify import verify_job
from tests.conftest import PG_URL, allow_connections, refuse_connections
from tests.runtime.helpers import Calls, assert_log_sound, ledger_rows, node, of_type, plan

# --- a store whose chosen commit fails ---------------------------------------------------------

Recorded = list[tuple[str, dict[str, Any]]]  # (method, keyword arguments) called on one tx


class _RecordingTx:
    def __init__(self, tx: Any, recorded: Recorded) -> None:
        self._tx = tx
        self._recorded = recorded

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._tx, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._recorded.append((name, kwargs))
            return attr(*args, **kwargs)

        return call


class _FlakyTransaction:
    def __init__(self, flaky: FlakyStore, durable: bool) -> None:
        self._flaky = flaky
        self._durable = durable
        self._recorded: Recorded = []

    def __enter__(self) -> Any:
        if self._flaky.down.is_set():
            raise StoreUnavailable("test: the database is down")
        self._inner = self._flaky.store.transaction(durable=self._durable)
        return _RecordingTx(self._inner.__enter__(), self._recorded)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any:
        flaky = self._flaky
        if exc is None and flaky.remaining > 0 and flaky.when(self._recorded):
            flaky.remaining -= 1
            if flaky.mode == "refused":  # an error that will not pass: the run raises it
                refused = StoreError("test: the database refused the commit")
                self._inner.__exit__(StoreError, refused, None)  # rolled back
                flaky.fired.append("refused")
                raise refused
            if flaky.mode == "after":
                self._inner.__exit__(None, None, None)  # the server commits
                flaky.fired.append("after")
                raise StoreUnavailable("test: the connection broke after COMMIT was sent")
            cut = StoreUnavailable("test: the connection broke before COMMIT")
            self._inner.__exit__(StoreUnavailable, cut, None)  # rolled back
            flaky.fired.append("before")
            raise cut
        result = self._inner.__exit__(exc_type, exc, tb)
        if exc is None and flaky.on_commit is not None:
            flaky.on_commit(self._recorded)
        return result


class FlakyStore:
    """The real ``store``; the first ``times`` write transactions for which ``when`` holds
    (given the calls made on them) fail at their commit, rolled back (``mode="before"``) or
    committed (``"after"``), or rolled back with an error that will not pass (``"refused"``: a
    plain ``StoreError``). While ``down`` is set, every write transaction fails at once."""

    def __init__(
        self,
        store: Store,
        when: Callable[[Recorded], bool] = lambda recorded: False,
        *,
        mode: str = "before",
        times: int = 1,
    ) -> None:
        self.store = store
        self.when = when
        self.mode = mode
        self.remaining = times
        self.fired: list[str] = []
        self.down = threading.Event()
        # called after each write transaction that committed, with the calls made on it
        self.on_commit: Callable[[Recorded], None] | None = None
        self.read_failures = 0  # the next reads of a log that fail
        self.claim_error: Exception | None = None  # what every claim raises, if set
        self.claims_refused = 0

    def transaction(self, *, durable: bool = True) -> _FlakyTransaction:
        return _FlakyTransaction(self, durable)

    def claim(self, **kwargs: Any) -> Any:  # (a transaction of its own)
        if self.down.is_set():
            raise StoreUnavailable("test: the database is down")
        if self.claim_error is not None:
            self.claims_refused += 1
            raise self.claim_error
        # the log is read by the run, as on SQLite (so read_failures apply on both backends)
        return self.store.claim(**{**kwargs, "with_log": False})

    def list_events(self, job_id: str, **kwargs: Any) -> Any:
        if self.read_failures > 0:
            self.read_failures -= 1
            raise StoreUnavailable("test: the connection broke while reading")
        return self.store.list_events(job_id, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def t1(recorded: Recorded) -> bool:
    return any(name == "ledger_insert" for name, _ in recorded)


def t2(recorded: Recorded) -> bool:
    return any(n == "ledger_finish" and kw.get("status") == "committed" for n, kw in recorded)


def failure_record(recorded: Recorded) -> bool:
    return any(n == "ledger_finish" and kw.get("status") == "failed" for n, kw in recorded)


def completion(recorded: Recorded) -> bool:
    return any(n == "set_status" and kw.get("status") == "completed" for n, kw in recorded)


# --- tools and fixtures ------------------------------------------------------------------------


def charge_tool(calls: Calls, fail_first: bool = False) -> Tool:
    def fn(ctx: ToolContext, amount: int) -> dict[str, Any]:
        calls.add(ctx, "charge")
        if fail_first and ctx.attempt == 1:
            raise RetryableError("the payment API timed out")
        return {"charged": amount}

    return Tool("charge", fn, "tool")


def email_tool(calls: Calls, during: Callable[[], None] | None = None) -> Tool:
    def fn(ctx: ToolContext, charge: Any) -> dict[str, Any]:
        calls.add(ctx, "email")
        if during is not None:
            during()
        return {"sent": True}

    return Tool("email", fn, "tool")


FLOW = plan(
    node("charge", "charge", args={"amount": 42}),
    node("email", "email", args={"charge": "${charge}"}, deps=["charge"]),
)


@pytest.fixture
def real_store(store_url: str) -> Iterator[Store]:
    store = open_store(store_url)
    yield store
    store.close()


def runtime_on(store: Any, *tools: Tool, **options: Any) -> Runtime:
    return Runtime(store=store, tools=ToolRegistry(tools), lease_seconds=30, **options)


def assert_done_once(rt: Runtime, job_id: str, calls: Calls) -> None:
    """Completed, every tool once, one invocation per node, and Verification Mode passes."""
    assert rt.get_job(job_id).status == "completed"
    assert calls.count(name="charge") == 1 and calls.count(name="email") == 1
    events = assert_log_sound(rt.store, job_id)
    assert [p["node_id"] for p in of_type(events, "tool_invocation_started")] == [
        "charge",
        "email",
    ]
    assert len(of_type(events, "node_finished")) == 2
    assert len(of_type(events, "job_completed")) == 1
    assert verify_job(rt.store, job_id).ok


# --- a commit that fails, before or after the server committed ---------------------------------


@pytest.mark.parametrize("mode", ["before", "after"])
@pytest.mark.parametrize("when", [t1, t2, completion], ids=["T1", "T2", "job_completed"])
def test_a_failed_commit_is_retried_and_nothing_is_written_twice(
    real_store: Store, calls: Calls, mode: str, when: Callable[[Recorded], bool]
) -> None:
    flaky = FlakyStore(real_store, when, mode=mode)
    rt = runtime_on(flaky, charge_tool(calls), email_tool(calls))
    job_id = rt.submit(FLOW, {}).job_id

    assert rt.run_until_idle() == 1
    assert flaky.fired == [mode]
    assert_done_once(rt, job_id, calls)
    assert rt.metrics.value("affidavit_store_retries_total", outcome="retried") == 1
    landed = rt.metrics.value("affidavit_store_retries_total", outcome="landed")
    assert landed == (1 if mode == "after" else 0)
    # counted once, whether the commit that recorded them was reported or found to have landed
    steps = {"node_type": "tool", "result_type": "side_effect_committed"}
    assert rt.metrics.value("affidavit_steps_total", **steps) == 2


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_failed_attempts_record_is_retried_and_written_once(
    real_store: Store, calls: Calls, mode: str
) -> None:
    flaky = FlakyStore(real_store, failure_record, mode=mode)
    rt = runtime_on(flaky, charge_tool(calls, fail_first=True), email_tool(calls))
    job_id = rt.submit(FLOW, {}).job_id

    rt.run_until_idle()
    assert flaky.fired == [mode]
    job = rt.get_job(job_id)
    assert job.status == "completed"
    assert calls.count(name="charge") == 2  # the failed attempt, then the retry
    events = assert_log_sound(rt.store, job_id)
    outcomes = [p["outcome"] for p in of_type(events, "tool_invocation_finished")]
    assert outcomes == ["failure", "success", "success"]
    assert verify_job(rt.store, job_id).ok


def test_a_commit_that_landed_is_told_apart_from_one_that_did_not(
    real_store: Store, calls: Calls
) -> None:
    """The landed check compares heads: three T2 commits fail after landing and are each
    recognized; the log holds each step once."""
    flaky = FlakyStore(real_store, t2, mode="after", times=3)
    flow = plan(
        node("a", "charge", args={"amount": 1}),
        node("b", "charge", args={"amount": 2}, deps=["a"]),
        node("c", "charge", args={"amount": 3}, deps=["b"]),
    )
    rt = runtime_on(flaky, charge_tool(calls))
    job_id = rt.submit(flow, {}).job_id
    rt.run_until_idle()
    assert flaky.fired == ["after"] * 3
    assert rt.get_job(job_id).status == "completed"
    assert calls.count(name="charge") == 3
    events = assert_log_sound(rt.store, job_id)
    assert len(of_type(events, "command_committed")) == 3
    assert rt.metrics.value("affidavit_store_retries_total", outcome="landed") == 3
    assert verify_job(rt.store, job_id).ok


# --- the database stays away -------------------------------------------------------------------


def test_a_run_gives_up_after_store_retry_seconds(real_store: Store, calls: Calls) -> None:
    """The step's record cannot be written for longer than the run keeps trying: the run gives
    up and the job keeps its open invocation, resolved like a crash's once the database is
    back and the lease has expired (no reconcile: parked, the tool not run again)."""
    flaky = FlakyStore(real_store)

    def outage() -> None:
        flaky.down.set()

    rt = Runtime(
        store=flaky,
        tools=ToolRegistry((charge_tool(calls), email_tool(calls, during=outage))),
        lease_seconds=0.5,
        store_retry_seconds=0.3,
    )
    job_id = rt.submit(FLOW, {}).job_id
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        rt.run_job(job_id)
    assert time.monotonic() - started < 10
    assert rt.metrics.value("affidavit_store_retries_total", outcome="gave_up") == 1
    assert rt.metrics.value("affidavit_store_retries_total", outcome="retried") >= 2

    flaky.down.clear()
    [_, row] = sorted(ledger_rows(rt.store, job_id), key=lambda r: r.node_id != "charge")
    assert (row.node_id, row.status) == ("email", "started")  # in flight: acted, not recorded
    time.sleep(0.6)  # the lease runs out
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "parked"
    assert calls.count(name="email") == 1


def test_a_run_reads_its_log_again_when_the_database_is_away(
    real_store: Store, calls: Calls
) -> None:
    """The claim committed, then the log could not be read: the run reads it again instead of
    leaving the job claimed until its lease (30 s here) runs out."""
    flaky = FlakyStore(real_store)
    rt = runtime_on(flaky, charge_tool(calls), email_tool(calls))
    job_id = rt.submit(FLOW, {}).job_id
    flaky.read_failures = 3
    started = time.monotonic()
    assert rt.run_until_idle() == 1
    assert time.monotonic() - started < 10
    assert flaky.read_failures == 0
    assert_done_once(rt, job_id, calls)


def test_a_run_that_cannot_read_its_log_gives_up_after_store_retry_seconds(
    real_store: Store, calls: Calls
) -> None:
    flaky = FlakyStore(real_store)
    rt = runtime_on(flaky, charge_tool(calls), email_tool(calls), store_retry_seconds=0.3)
    job_id = rt.submit(FLOW, {}).job_id
    flaky.read_failures = 10_000
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        rt.run_job(job_id)
    assert time.monotonic() - started < 10
    assert calls.count() == 0 and rt.get_job(job_id).status == "running"  # claimed, not run


def test_a_run_whose_lease_is_taken_while_it_retries_writes_nothing(
    real_store: Store, store_url: str, calls: Calls
) -> None:
    """While the first worker cannot reach the database its heartbeats fail and its lease runs
    out; a second worker (its own connection, which works) claims the job and resolves the
    open invocation. When the database comes back, the first run's retried record is fenced
    off: it ends as ``lost`` and writes nothing."""
    flaky = FlakyStore(real_store)
    inside = threading.Event()

    def outage() -> None:
        flaky.down.set()
        inside.set()

    tools = ToolRegistry((charge_tool(calls), email_tool(calls, during=outage)))
    first = Worker(flaky, tools, worker_id="first", lease_seconds=0.5, store_retry_seconds=30)
    rt = Runtime(store=real_store, tools=tools, lease_seconds=30)
    job_id = rt.submit(FLOW, {}).job_id
    statuses: list[str | None] = []
    thread = threading.Thread(target=lambda: statuses.append(first.run_once()), daemon=True)
    thread.start()
    assert inside.wait(10)

    other = open_store(store_url)
    try:
        second = Worker(other, tools, worker_id="second", lease_seconds=30)
        deadline = time.monotonic() + 10
        while (status := second.run_once()) is None:  # until the first lease has run out
            assert time.monotonic() < deadline, "the first worker's lease never expired"
            time.sleep(0.1)
        assert status == "parked"  # the email may or may not have gone out: a person decides
    finally:
        other.close()
    flaky.down.clear()
    thread.join(15)
    assert not thread.is_alive() and statuses == ["lost"]
    assert rt.get_job(job_id).status == "parked"
    assert calls.count(name="email") == 1
    events = assert_log_sound(real_store, job_id)
    assert not of_type(events, "command_committed")[1:]  # only the charge was recorded


def test_an_outage_right_after_t1_is_waited_out_before_the_tool_is_called(
    real_store: Store, calls: Calls
) -> None:
    """The database goes away right after the e-mail step's T1 and stays away while the lease
    runs into its last third, so the confirmation before the tool call needs a renewal it
    cannot write. The run asks again until the database is back (nobody else claimed the job:
    the renewal succeeds) and then calls the tool, instead of ending with the step open (which
    the next claim would park: the tool has no reconcile)."""
    flaky = FlakyStore(real_store)

    def after_email_t1(recorded: Recorded) -> None:
        if any(n == "ledger_insert" and kw.get("node_id") == "email" for n, kw in recorded):
            flaky.down.set()
            threading.Timer(1.5, flaky.down.clear).start()
            time.sleep(0.5)  # heartbeats fail meanwhile: the 0.6 s lease is nearly out

    flaky.on_commit = after_email_t1
    tools = ToolRegistry((charge_tool(calls), email_tool(calls)))
    rt = Runtime(store=flaky, tools=tools, lease_seconds=0.6)
    job_id = rt.submit(FLOW, {}).job_id
    rt.run_until_idle()
    assert_done_once(rt, job_id, calls)


def test_a_worker_waits_out_an_outage_without_a_traceback(
    real_store: Store, calls: Calls, caplog: pytest.LogCaptureFixture
) -> None:
    flaky = FlakyStore(real_store)
    rt = runtime_on(flaky, charge_tool(calls), email_tool(calls))
    job_id = rt.submit(FLOW, {}).job_id
    flaky.down.set()
    threading.Timer(1.2, flaky.down.clear).start()
    with caplog.at_level(logging.WARNING, logger="affidavit"):
        assert rt.run_until_idle() == 1
    assert_done_once(rt, job_id, calls)
    messages = [r.getMessage() for r in caplog.records]
    assert any("the database is unavailable" in m for m in messages)
    assert any("reachable again" in m for m in messages)
    assert not any(r.exc_info for r in caplog.records)


def test_a_worker_gives_up_after_max_outage_seconds(real_store: Store, calls: Calls) -> None:
    """With ``max_outage_seconds``, a database that stays away ends the run instead of being
    waited for without end: every claim fails, and after that long the worker raises, with the
    store's hint; nothing was written. The same outage, shorter than the limit, is ridden out
    (the next test), and without the limit the worker waits (the test before)."""
    flaky = FlakyStore(real_store)
    rt = runtime_on(flaky, charge_tool(calls), email_tool(calls), max_outage_seconds=1.0)
    job_id = rt.submit(FLOW, {}).job_id
    flaky.down.set()
    guard = threading.Timer(30, flaky.down.clear)  # a worker that never gives up: fails, not hangs
    guard.start()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"unavailable for 1 s or more") as raised:
        rt.run_until_idle(concurrency=3)  # every loop stops, not only the one that gave up
    waited = time.monotonic() - started
    guard.cancel()
    assert 1.0 <= waited < 8, waited  # (the other loops may sleep out a wait of up to 5 s)
    assert "test: the database is down" in raised.value.message
    assert raised.value.hint == StoreUnavailable.default_hint
    assert isinstance(raised.value.__cause__, StoreUnavailable)
    assert calls.count() == 0 and rt.get_job(job_id).status == "pending"

    flaky.down.clear()  # back: the same runtime runs the job
    assert rt.run_until_idle() == 1
    assert_done_once(rt, job_id, calls)


def test_an_outage_shorter_than_max_outage_seconds_is_ridden_out(
    real_store: Store, calls: Calls
) -> None:
    flaky = FlakyStore(real_store)
    rt = runtime_on(flaky, charge_tool(calls), email_tool(calls), max_outage_seconds=30.0)
    job_id = rt.submit(FLOW, {}).job_id
    flaky.down.set()
    threading.Timer(1.2, flaky.down.clear).start()
    assert rt.run_until_idle() == 1
    assert_done_once(rt, job_id, calls)


def test_runs_that_keep_giving_up_count_as_one_outage(real_store: Store, calls: Calls) -> None:
    """The claim works but every run gives up (its writes fail past ``store_retry_seconds``, as
    on a full disk whose claims still fit): that too is an outage that does not end, and the
    worker gives up on it instead of claiming the job again every lease period."""
    flaky = FlakyStore(real_store, when=t1, times=1_000_000)  # every T1 fails at its commit
    rt = Runtime(
        store=flaky,
        tools=ToolRegistry((charge_tool(calls), email_tool(calls))),
        lease_seconds=0.3,
        store_retry_seconds=0.2,
        max_outage_seconds=1.5,
    )
    job_id = rt.submit(FLOW, {}).job_id

    def end_outage() -> None:  # a worker that never gives up: fails, not hangs
        flaky.remaining = 0

    guard = threading.Timer(30, end_outage)
    guard.start()
    with pytest.raises(StoreUnavailable, match=r"gave up"):
        rt.run_until_idle()
    guard.cancel()
    assert len(flaky.fired) >= 4  # claimed again after each lease ran out, T1 failing each time
    assert calls.count() == 0  # no tool acted: T1 never landed
    assert rt.get_job(job_id).status == "running"  # given up, its lease runs out


def test_a_run_that_gave_up_is_not_waited_for_past_max_outage_seconds(
    real_store: Store, calls: Calls
) -> None:
    """The run gave up and its job keeps the lease (5 s) it had: nothing else is runnable, but
    the worker neither calls that idle (the job is stuck, the database unwritable) nor waits
    out the lease past its limit."""
    flaky = FlakyStore(real_store, when=t1, times=1_000_000)
    rt = Runtime(
        store=flaky,
        tools=ToolRegistry((charge_tool(calls), email_tool(calls))),
        lease_seconds=5,
        store_retry_seconds=0.2,
        max_outage_seconds=1,
    )
    job_id = rt.submit(FLOW, {}).job_id
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"gave up"):
        rt.run_until_idle()
    assert time.monotonic() - started < 4  # not the 5 s lease
    assert flaky.fired  # (the run's tries of T1, each failing at its commit)
    job = rt.get_job(job_id)
    assert job.status == "running" and job.lease_expires_at is not None
    assert job.lease_expires_at > time.time()  # still the given-up run's lease


def test_until_idle_does_not_leave_behind_a_job_whose_run_gave_up(
    real_store: Store, calls: Calls
) -> None:
    """A run gives up (its T1 fails past ``store_retry_seconds``) and nothing else is runnable
    while its lease runs: that is not idle. ``run_until_idle`` waits, takes the job up again
    once the lease expired, and returns with it completed (no limit set) — it returned at once
    before, leaving the job running for a worker that might never come."""
    flaky = FlakyStore(real_store, when=t1, times=6)  # the first run's tries, and one more
    rt = Runtime(
        store=flaky,
        tools=ToolRegistry((charge_tool(calls), email_tool(calls))),
        lease_seconds=1,
        store_retry_seconds=0.2,
    )
    job_id = rt.submit(FLOW, {}).job_id
    assert rt.run_until_idle() >= 2  # the run that gave up, then the one that completed
    assert rt.metrics.value("affidavit_store_retries_total", outcome="gave_up") >= 1
    assert flaky.remaining == 0 and len(flaky.fired) == 6
    assert_done_once(rt, job_id, calls)


@pytest.mark.parametrize("times", [1, 1_000_000], ids=["once", "always"])
def test_until_idle_takes_up_again_a_job_whose_run_raised(
    real_store: Store, calls: Calls, caplog: pytest.LogCaptureFixture, times: int
) -> None:
    """A run raises an error that is not an outage (here the database refuses T1): the worker
    logs it with its traceback and goes on, and the job — which keeps its lease — is not idle
    for ``run_until_idle``: it is taken up again when the lease expired. Once, the job then
    completes; always, it is parked as ``crash_loop`` after ``max_recoveries`` — either way
    ``run_until_idle`` does not return with the job left running."""
    flaky = FlakyStore(real_store, when=t1, mode="refused", times=times)
    rt = Runtime(
        store=flaky,
        tools=ToolRegistry((charge_tool(calls), email_tool(calls))),
        lease_seconds=0.3,
        max_recoveries=2,
    )
    job_id = rt.submit(FLOW, {}).job_id
    with caplog.at_level(logging.ERROR, logger="affidavit"):
        rt.run_until_idle()
    failed = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert failed and all(r.exc_info for r in failed)
    if times == 1:
        assert_done_once(rt, job_id, calls)
    else:
        job = rt.get_job(job_id)
        assert job.status == "parked", job
        parked = of_type(rt.store.list_events(job_id), "job_parked")
        assert [p["reason"] for p in parked] == ["crash_loop"]
        assert calls.count() == 0  # T1 never landed: no tool acted
        assert len(flaky.fired) == 3  # the first run and two recoveries, then the park


def test_max_outage_seconds_must_not_be_negative(real_store: Store) -> None:
    with pytest.raises(ValueError, match="max_outage_seconds"):
        Worker(real_store, ToolRegistry(()), max_outage_seconds=-1)
    with pytest.raises(ValueError, match="max_outage_seconds"):
        Worker(real_store, ToolRegistry(()), max_outage_seconds=float("nan"))


# --- real outages ------------------------------------------------------------------------------


def run_through_outage(store: Store, outage: Callable[[], None], calls: Calls) -> None:
    """Run FLOW with ``outage`` started from inside its e-mail tool: the job completes, every
    tool once, after at least one retried write."""
    rt = runtime_on(store, charge_tool(calls), email_tool(calls, during=outage))
    job_id = rt.submit(FLOW, {}).job_id
    rt.run_until_idle()
    assert_done_once(rt, job_id, calls)
    assert rt.metrics.value("affidavit_store_retries_total", outcome="retried") >= 1


def test_sqlite_write_lock_held_past_the_busy_timeout(tmp_path: Any, calls: Calls) -> None:
    """Another process holds SQLite's write lock for a second while a tool runs; the store
    gives up after 0.1 s (its busy timeout), so T2 meets ``database is locked`` and the run
    tries again until the lock is free."""
    path = tmp_path / "locked.db"
    store = SqliteStore(f"sqlite:///{path}", str(path), busy_timeout_s=0.1)
    holder = connect_raw(path, autocommit=True)

    def lock_the_database() -> None:
        holder.execute("BEGIN IMMEDIATE")
        threading.Timer(1.0, lambda: holder.execute("COMMIT")).start()

    try:
        run_through_outage(store, lock_the_database, calls)
    finally:
        holder.close()
        store.close()


def test_sqlite_locked_is_unavailable(tmp_path: Any) -> None:
    path = tmp_path / "x.db"
    store = SqliteStore(f"sqlite:///{path}", str(path), busy_timeout_s=0.05)
    holder = connect_raw(path, autocommit=True)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="locked"), store.transaction():
            pass
    finally:
        holder.close()
        store.close()


def test_an_error_that_will_not_pass_is_not_unavailable(real_store: Store) -> None:
    """Only failures that may pass are retried: a statement the database refuses is not."""
    with pytest.raises(StoreError) as caught, real_store.transaction() as tx:
        tx.execute("INSERT INTO no_such_table VALUES (1)")
    assert not isinstance(caught.value, StoreUnavailable)


def test_postgresql_outage_while_a_tool_runs(pg_database: str, calls: Calls) -> None:
    """While the e-mail tool runs, the database stops accepting connections and every session
    on it is terminated, for 1.5 s (what a restart or failover looks like to a client). The
    job completes instead of being parked, with every tool run once."""
    url = PG_URL.rsplit("/", 1)[0] + f"/{pg_database}"
    store = open_store(url)
    try:
        run_through_outage(store, lambda: _refuse_connections(pg_database, 1.5), calls)
    finally:
        store.close()


def test_concurrent_steps_with_commits_that_landed(real_store: Store, calls: Calls) -> None:
    """Two independent steps run at once; both of their T2 commits fail after landing. Each is
    recognized before the other step writes (the run's lock is held while a commit's outcome
    is unknown), and the join step sees both results."""
    flaky = FlakyStore(real_store, t2, mode="after", times=2)
    flow = plan(
        node("left", "charge", args={"amount": 1}),
        node("right", "charge", args={"amount": 2}),
        node("email", "email", args={"charge": ["${left}", "${right}"]}, deps=["left", "right"]),
    )
    rt = runtime_on(flaky, charge_tool(calls), email_tool(calls), step_concurrency=2)
    job_id = rt.submit(flow, {}).job_id
    rt.run_until_idle()
    assert flaky.fired == ["after", "after"]
    assert rt.get_job(job_id).status == "completed"
    assert calls.count(name="charge") == 2 and calls.count(name="email") == 1
    events = assert_log_sound(rt.store, job_id)
    assert len(of_type(events, "command_committed")) == 3
    assert verify_job(rt.store, job_id).ok


def test_postgresql_sessions_ended_at_once_fail_one_operation_not_one_per_connection(
    pg_schema: str,
) -> None:
    """A restart or failover ends every session of the pool at once. The first operation that
    meets a dead connection fails (the caller may try again); the pool's other connections are
    checked then and replaced, so the operations after it do not fail one by one — as many as
    the pool held — while the server is long back."""
    store = open_store(f"{PG_URL}?schema={pg_schema}&application_name={pg_schema}")
    try:
        job, _ = store.create_job()
        start = threading.Barrier(6)

        def hold_a_connection() -> None:
            start.wait()
            with store.transaction() as tx:
                tx.query("SELECT pg_sleep(0.2)")

        threads = [threading.Thread(target=hold_a_connection) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (pg_schema,),
            ).fetchall()
        assert len(ended) >= 6
        failed = 0
        for _ in range(6):
            try:
                store.get_job(job.job_id)
            except StoreUnavailable:
                failed += 1
        assert failed <= 1
    finally:
        store.close()


def _refuse_connections(database: str, seconds: float) -> None:
    """Make ``database`` refuse connections and end its sessions, for ``seconds``."""
    refuse_connections(database)
    threading.Timer(seconds, allow_connections, args=(database,)).start()


@pytest.mark.parametrize("retry", [30.0, 0.0])
def test_waiting_for_a_job_rides_out_an_outage(pg_database: str, retry: float) -> None:
    """`Runtime.wait` (and `affidavit jobs wait`) keeps polling through a database restart
    shorter than store_retry_seconds and returns the job once a worker finished it; an outage
    longer than that (here: any, with 0) ends the wait with StoreUnavailable. (PostgreSQL: a
    SQLite read in WAL mode is not made unavailable by another process.)"""
    url = PG_URL.rsplit("/", 1)[0] + f"/{pg_database}"
    tools = ToolRegistry([Tool("echo", lambda ctx, x: {"x": x}, "pure")])
    with Runtime(url, tools=tools, store_retry_seconds=retry) as rt:
        job_id = rt.submit(plan(node("e", "echo", "pure", args={"x": 1})), {}).job_id
        outcome: list[Any] = []

        def wait() -> None:
            try:
                outcome.append(rt.wait(job_id, timeout=60, poll_seconds=0.1))
            except StoreUnavailable as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)  # the wait is polling
        _refuse_connections(pg_database, 1.5)
        time.sleep(2.5)  # the database is back
        if retry > 1.5:
            assert waiter.is_alive() and not outcome  # still waiting, through the outage
            assert rt.run_until_idle() == 1
            waiter.join(30)
            assert [job.status for job in outcome] == ["completed"]
        else:
            waiter.join(30)
            assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailable)


def test_a_claim_that_keeps_failing_stops_the_worker_instead_of_spinning(
    real_store: Store, calls: Calls
) -> None:
    """A claim refused by the database for a reason that will not pass (not an outage) would
    fail the same way at once if tried again: the worker stops with that error rather than
    trying in a busy loop (each of its claim loops tries once), and nothing runs."""
    flaky = FlakyStore(real_store)
    rt = runtime_on(flaky, charge_tool(calls), email_tool(calls))
    job_id = rt.submit(FLOW, {}).job_id
    flaky.claim_error = StoreError("test: permission denied for table jobs")
    started = time.monotonic()
    with pytest.raises(StoreError, match="permission denied"):
        rt.worker.run(until_idle=True, concurrency=3)
    assert time.monotonic() - started < 5
    assert 1 <= flaky.claims_refused <= 3
    assert calls.count() == 0 and rt.get_job(job_id).status == "pending"
