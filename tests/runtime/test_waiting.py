"""``Runtime.wait`` / ``wait_for_job``: a submitter waiting for a job that a worker elsewhere
runs, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core.errors import JobNotFound, WaitTimeout
from affidavit.runtime._worker import Worker
from affidavit.store import JobRecord, open_store
from tests.runtime.helpers import node, plan


def slow_tool(started: threading.Event, release: threading.Event) -> Tool:
    def fn(ctx: ToolContext) -> dict[str, Any]:
        started.set()
        assert release.wait(30)
        return {"done": True}

    return Tool("slow", fn, "tool")


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    runtime = Runtime(store_url, tools=ToolRegistry(()), lease_seconds=30)
    yield runtime
    runtime.close()


def test_wait_returns_once_a_worker_elsewhere_completes_the_job(store_url: str) -> None:
    started, release = threading.Event(), threading.Event()
    tools = ToolRegistry((slow_tool(started, release),))
    rt = Runtime(store_url, tools=tools, lease_seconds=30)
    job_id = rt.submit(plan(node("a", "slow")), {}).job_id
    other = open_store(store_url)  # the worker's own connection, as another process has
    worker = Worker(other, tools, worker_id="elsewhere", lease_seconds=30)
    thread = threading.Thread(target=lambda: worker.run(until_idle=True), daemon=True)
    thread.start()
    try:
        assert started.wait(10)
        with pytest.raises(WaitTimeout) as timed_out:
            rt.wait(job_id, timeout=0.3)
        assert timed_out.value.job.status == "running"
        threading.Timer(0.3, release.set).start()
        job = rt.wait(job_id, timeout=30, poll_seconds=0.05)
        assert job.status == "completed" and job.output == {"a": {"done": True}}
    finally:
        release.set()
        thread.join(30)
        other.close()
        rt.close()


def test_wait_returns_a_job_that_needs_a_person(rt: Runtime) -> None:
    job_id = rt.submit(plan({"id": "approve", "type": "approval"}), {}).job_id
    rt.run_until_idle()
    started = time.monotonic()
    job: JobRecord = rt.wait(job_id, timeout=10)
    assert job.status == "waiting" and time.monotonic() - started < 5


def test_wait_times_out_on_a_job_nobody_runs(rt: Runtime) -> None:
    job_id = rt.submit(plan({"id": "approve", "type": "approval"}), {}).job_id
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=f"job {job_id} is still pending after 0.4 s"):
        rt.wait(job_id, timeout=0.4)
    assert 0.4 <= time.monotonic() - started < 5


def test_wait_checks_its_arguments(rt: Runtime) -> None:
    with pytest.raises(JobNotFound):
        rt.wait("no-such-job", timeout=1)
    job_id = rt.submit(plan({"id": "approve", "type": "approval"}), {}).job_id
    with pytest.raises(ValueError, match="timeout"):
        rt.wait(job_id, timeout=-1)
    with pytest.raises(ValueError, match="poll_seconds"):
        rt.wait(job_id, poll_seconds=0)
