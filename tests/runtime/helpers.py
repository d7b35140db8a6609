"""Shared checks for the runtime tests: the log's invariants, the ledger, subprocess drivers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import apsw
import psycopg

from affidavit import ToolContext
from affidavit.core.canonical import canonical, parse
from affidavit.core.chain import check_stored_chain
from affidavit.core.events import validate_payload
from affidavit.record._replay import build_from_events
from affidavit.store import LedgerRow, Store, StoredEvent
from affidavit.store.postgres import split_url
from affidavit.store.sqlite import connect_raw

DRIVER = Path(__file__).with_name("driver.py")


def driver_env(crash: str | None = None, stop: str | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("AFFIDAVIT_CRASH_AT", "AFFIDAVIT_STOP_AT")
    }
    if crash is not None:
        env["AFFIDAVIT_CRASH_AT"] = crash
    if stop is not None:
        env["AFFIDAVIT_STOP_AT"] = stop
    return env


def spawn_driver(
    url: str, *args: str, crash: str | None = None, stop: str | None = None
) -> subprocess.Popen[str]:
    """Start a worker process (tests/runtime/driver.py) on ``url``."""
    return subprocess.Popen(
        [sys.executable, str(DRIVER), url, *args],
        env=driver_env(crash, stop),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_driver(
    url: str, *args: str, crash: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DRIVER), url, *args],
        env=driver_env(crash),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ledger_rows(store: Store, job_id: str) -> list[LedgerRow]:
    with store.transaction(durable=False) as tx:
        return tx.ledger_list(job_id)


def wait_lease_expired(store: Store, job_id: str, timeout: float = 15.0) -> None:
    """Wait until nobody holds ``job_id``'s lease (a dead worker's lease ran out)."""
    end = time.monotonic() + timeout
    while True:
        expires = store.get_job(job_id).lease_expires_at
        if expires is None or expires < time.time():
            return
        assert time.monotonic() < end, f"lease of {job_id} did not expire within {timeout}s"
        time.sleep(min(0.05, max(0.0, expires - time.time()) + 0.01))


def of_type(events: list[StoredEvent], event_type: str) -> list[dict[str, Any]]:
    return [e.payload for e in events if e.type == event_type]


def assert_log_sound(store: Store, job_id: str) -> list[StoredEvent]:
    """Check everything the log and the ledger promise about one job; return its events.

    - versions 1..n without gaps, every stored chain hash recomputes, the job's head matches;
    - every payload is valid for its type (docs/formats.md §3);
    - closing rule: every ``tool_invocation_started`` is closed by at most one
      ``tool_invocation_finished`` (exactly one once the job is terminal), nothing is finished
      without having started, and a key has at most one open invocation;
    - every ``command_committed`` names a successfully finished invocation of its key;
    - the ledger agrees with the log (committed with the same result / started = the open
      invocation / failed = closed and not committed), and the job status with the replay.
    """
    job = store.get_job(job_id)
    events = store.list_events(job_id)
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    chain = check_stored_chain(
        (e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash) for e in events
    )
    assert chain.ok, f"chain broken at version {chain.first_bad_version}"
    assert job.head_hash == chain.root
    for e in events:
        validate_payload(e.type, e.payload)
        # stored bytes are exactly JCS(payload), whichever encoder the runtime used
        assert canonical(parse(e.payload_bytes)) == e.payload_bytes, e.type

    started = of_type(events, "tool_invocation_started")
    finished = of_type(events, "tool_invocation_finished")
    started_ids = Counter(s["invocation_id"] for s in started)
    finished_ids = Counter(f["invocation_id"] for f in finished)
    assert all(n == 1 for n in started_ids.values()), "an invocation started twice"
    assert all(n == 1 for n in finished_ids.values()), "an invocation finished twice"
    assert set(finished_ids) <= set(started_ids), "finished without started"
    open_ = [s for s in started if s["invocation_id"] not in finished_ids]
    if job.terminal:
        assert not open_, f"{job.status} job has open invocations: {open_}"
    assert len({s["idempotency_key"] for s in open_}) == len(open_)
    key_of = {s["invocation_id"]: s["idempotency_key"] for s in started}
    for f in finished:
        assert key_of[f["invocation_id"]] == f["idempotency_key"]
    succeeded = {f["invocation_id"] for f in finished if f["outcome"] == "success"}
    for c in of_type(events, "command_committed"):
        assert c["command_id"] in succeeded
        assert key_of[c["command_id"]] == c["idempotency_key"]

    replay = build_from_events(events)
    rows = ledger_rows(store, job_id)
    assert {r.idempotency_key for r in rows} == set(replay.invocations)
    for row in rows:
        inv = replay.invocations[row.idempotency_key]
        if row.status == "committed":
            assert inv.committed and inv.pending is None
            assert inv.result == row.result
        elif row.status == "started":
            assert inv.pending is not None and inv.pending["invocation_id"] == row.invocation_id
        else:
            assert row.status == "failed" and not inv.committed and inv.pending is None
    if job.status != "running":  # a crashed run leaves "running" until it is reclaimed
        assert replay.status == job.status
    return events


# --- in-process runs ---------------------------------------------------------------------------


class SimulatedCrash(BaseException):
    """Raised at a crash point instead of SIGKILL: nothing after it runs, no handler writes
    anything (the runner only catches ``Exception`` subclasses), the lease is left to expire."""


class Calls:
    """A side channel in the test process: every real call of a tool, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, int, str]] = []
        self._lock = threading.Lock()

    def add(self, ctx: ToolContext, name: str) -> None:
        with self._lock:
            self.log.append((name, ctx.node_id, ctx.attempt, ctx.external_key))

    def count(self, node_id: str | None = None, name: str | None = None) -> int:
        return sum(
            1
            for n, node, _, _ in self.log
            if (node_id is None or node == node_id) and (name is None or n == name)
        )


def node(
    node_id: str, tool: str, kind: str = "tool", args: Any = None, deps: Any = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"id": node_id, "type": kind, "tool": tool}
    if args is not None:
        out["args"] = args
    if deps:
        out["depends_on"] = deps
    return out


def plan(*nodes: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {
        "name": "unit",
        "retry": {"max_attempts": 3, "backoff_seconds": 0},
        **settings,
        "nodes": list(nodes),
    }


def write_lock_free(url: str, job_id: str) -> bool:
    """Can the job be written now without waiting (no transaction of a frozen process holds
    the SQLite write lock or the job's PostgreSQL row lock)?"""
    if url.startswith("sqlite:///"):
        conn = connect_raw(url[len("sqlite:///") :], timeout=0, autocommit=True)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except apsw.BusyError:
            return False
        finally:
            conn.close()
    conninfo, schema = split_url(url)
    with psycopg.connect(conninfo) as conn:
        try:
            conn.execute(
                f'SELECT 1 FROM "{schema}".jobs WHERE job_id = %s FOR UPDATE NOWAIT', (job_id,)
            )
            return True
        except psycopg.errors.LockNotAvailable:
            return False
