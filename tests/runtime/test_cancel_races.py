"""A person's cancel racing with a worker process that is running the job."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from affidavit import Runtime
from affidavit.runtime._decisions import cancel_job
from affidavit.verify import verify_job
from tests.runtime.crash_tools import REGISTRY, counts
from tests.runtime.helpers import assert_log_sound, of_type, spawn_driver


def _wait_for(
    what: str, check: Callable[[], object], proc: subprocess.Popen[str], timeout: float
) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"the worker exited before {what}: {proc.communicate()}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("step_concurrency", ["1", "2"])
def test_a_cancel_cuts_the_backoff_of_a_run(
    store_url: str, tmp_path: Path, step_concurrency: str
) -> None:
    """A retry's backoff is cut short when the run's lease is lost, with or without step
    concurrency: a cancel recorded while a step waits out its backoff ends the worker's run at
    once (as ``lost``), not after the backoff, and no try starts after the cancel."""
    side = str(tmp_path / "side.jsonl")
    plan = {
        "name": "busy",
        "retry": {"max_attempts": 3, "backoff_seconds": 30.0},
        "nodes": [{"id": "busy", "type": "tool", "tool": "crash_busy", "args": {"side": side}}],
    }
    with Runtime(store_url, tools=REGISTRY) as rt:
        job = rt.submit(plan, {})
        proc = spawn_driver(store_url, "--job", job.job_id, "--lease", "1.5",
                            "--step-concurrency", step_concurrency)  # fmt: skip
        try:
            # the first try failed retryably and is recorded: the run is in its 30 s backoff
            _wait_for(
                "the first failure",
                lambda: of_type(rt.store.list_events(job.job_id), "node_finished"),
                proc,
                15.0,
            )
            cancel_job(rt.store, job.job_id, reason="no longer needed")
            try:
                out, err = proc.communicate(timeout=8.0)  # the heartbeat finds the lease lost
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise AssertionError("the worker sat out the backoff of a cancelled job") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert json.loads(out.strip().splitlines()[-1])["status"] == "lost", err
        assert counts(side, "busy")[(job.job_id, "busy")] == 1
        assert rt.get_job(job.job_id).status == "cancelled"
        assert_log_sound(rt.store, job.job_id)
        assert verify_job(rt.store, job.job_id).ok
