"""A worker started while PostgreSQL is down or restarting waits for it — connecting, opening
its pool and migrating inside the same bounded wait as its claim loops — instead of exiting;
``--max-outage-seconds`` bounds that wait too. A database that will not come by waiting (no
such database, a refused login) still fails at once. The server is a private one of the test
(the shared test server is never stopped)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from affidavit import Runtime
from affidavit.core.errors import StoreError, StoreUnavailable
from affidavit.runtime._worker import open_store_waiting
from affidavit.store import open_store
from tests.chaos import tools as chaos_tools
from tests.conftest import PG_URL, pg_available
from tests.pg_cluster import PrivateCluster, private_cluster_or_skip

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    yield from private_cluster_or_skip()


def _worker(url: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CHAOS_WORLD_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "affidavit",
            "worker",
            "--until-idle",
            "--db",
            url,
            "--tools",
            "tests.chaos.tools",
            "--lease-seconds",
            "5",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class _Lines:
    """A process's stderr lines as they come, and an event for the first one holding a text."""

    def __init__(self, proc: subprocess.Popen[str], marker: str) -> None:
        self.lines: list[str] = []
        self.seen = threading.Event()
        self._marker = marker
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line)
            if self._marker in line:
                self.seen.set()

    def text(self) -> str:
        self._thread.join(timeout=30)
        return "".join(self.lines)


def _setup_world(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(chaos_tools.SCHEMA)


def test_a_worker_started_while_the_server_is_down_waits_and_runs_the_job(
    cluster: PrivateCluster,
) -> None:
    url = cluster.create_database("jobs")
    _setup_world(url)
    with Runtime(url) as rt:
        job_id = rt.submit(chaos_tools.order_plan(delay=0), {"n": 1}).job_id
    cluster.stop("fast")
    proc = _worker(url, "--max-outage-seconds", "300")
    stderr = _Lines(proc, "unavailable at start")
    try:
        end = time.monotonic() + 120
        while not stderr.seen.wait(0.2):  # waiting, not exited
            assert proc.poll() is None and time.monotonic() < end, stderr.text()
        cluster.start()
        assert proc.wait(timeout=180) == 0, stderr.text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "reachable again" in stderr.text()
    with Runtime(url) as rt:
        assert rt.store.get_job(job_id).status == "completed"
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT node_id FROM effects ORDER BY node_id").fetchall()
    assert rows == [("charge",), ("notify",)]


def test_a_fresh_database_is_migrated_once_the_server_is_back(cluster: PrivateCluster) -> None:
    """No schema yet and the server down: the worker's first open, after the wait, migrates."""
    url = cluster.create_database("fresh")
    cluster.stop("immediate")  # as a crash
    back = threading.Timer(2.0, cluster.start)
    back.start()
    try:
        store = open_store_waiting(url, max_outage_seconds=300)
    finally:
        back.join()
    try:
        assert store.schema_version() > 0
        assert store.list_jobs() == []
    finally:
        store.close()


def test_the_wait_at_start_is_bounded_by_max_outage_seconds(cluster: PrivateCluster) -> None:
    url = cluster.create_database("jobs")
    cluster.stop("fast")
    proc = _worker(url, "--max-outage-seconds", "1")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "unavailable" in err and "gave up" in err
    assert "Traceback" not in err
    with pytest.raises(StoreUnavailable, match="gave up"):
        open_store_waiting(url, max_outage_seconds=0)


@pytest.mark.skipif(not pg_available(), reason="the shared PostgreSQL test server is unreachable")
def test_a_database_that_waiting_cannot_bring_fails_at_once() -> None:
    """No such database: a plain StoreError (exit 3 at once), not a wait."""
    base = PG_URL.rsplit("/", 1)[0]
    url = f"{base}/affidavit_no_such_database_here"
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert not isinstance(caught.value, StoreUnavailable)
    assert "does not exist" in caught.value.message
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        open_store_waiting(url, max_outage_seconds=300)
    assert not isinstance(caught.value, StoreUnavailable)
    assert time.monotonic() - started < 60  # (no wait: failed at the first try)
    proc = _worker(url)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "does not exist" in err and "trying again" not in err


def test_a_server_that_is_not_listening_is_unavailable() -> None:
    """Nothing listens on the port: a StoreUnavailable (a worker waits for it)."""
    with pytest.raises(StoreUnavailable, match="cannot connect"):
        open_store("postgresql://root@127.0.0.1:1/none")
