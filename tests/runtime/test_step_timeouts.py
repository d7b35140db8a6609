"""Step timeouts in a real worker process: a timed-out try is abandoned (Python cannot kill
a thread), and an abandoned try that never returns must not keep the process from exiting.
A payment without a reconcile hook that is not declared idempotent parks on it (its outcome
is unknown), open for a person to decide."""

from __future__ import annotations

import time
from pathlib import Path

from affidavit import Runtime
from affidavit.verify import verify_job
from tests.runtime.crash_tools import REGISTRY, counts
from tests.runtime.helpers import assert_log_sound, of_type, run_driver


def test_a_worker_exits_while_a_timed_out_try_still_hangs(store_url: str, tmp_path: Path) -> None:
    side = tmp_path / "side.jsonl"
    hang = {
        "id": "pay",
        "type": "tool",
        "tool": "crash_slow_charge_nr",
        "args": {"side": "${input.side}", "amount": 5, "delay": 3600},
        "timeout_seconds": 0.3,
    }
    graph = {"name": "hang", "retry": {"max_attempts": 1, "backoff_seconds": 0}, "nodes": [hang]}
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_id = rt.submit(graph, {"side": str(side)}).job_id
        t0 = time.monotonic()
        proc = run_driver(store_url, "--job", job_id, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert time.monotonic() - t0 < 20  # not held until the abandoned call returns
        job = rt.get_job(job_id)
        assert job.status == "parked"
        assert counts(side, "charge")[(job_id, "pay")] == 1
        events = assert_log_sound(rt.store, job_id)
        assert of_type(events, "tool_invocation_finished") == []  # open: unknown, not failed
        [parked] = of_type(events, "job_parked")
        assert parked["reason"] == "in_flight" and parked["detail"]["timeout_seconds"] == 0.3
        assert verify_job(rt.store, job_id).ok
