"""A worker process for the reliability tests (run as a real subprocess).

    python driver.py URL [--lease S] [--job JOB] [--until-done] [--concurrency N]
                         [--step-concurrency N]

Opens the store at URL, loads the tools of :mod:`tests.runtime.crash_tools` and runs jobs:
``--job`` runs that one job once (prints ``{"status": ...}``); otherwise it works until no job
is runnable (``--until-done``: until no job is pending or running at all, waiting for expired
leases of dead workers to be reclaimable). ``AFFIDAVIT_CRASH_AT`` in the environment makes it
SIGKILL itself at that point. The last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project root: `tests.…`

from affidavit.runtime._worker import Worker
from affidavit.store import JobFilter, open_store
from tests.runtime.crash_tools import REGISTRY


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--lease", type=float, default=15.0)
    parser.add_argument("--job")
    parser.add_argument("--until-done", action="store_true")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--step-concurrency", type=int, default=1)
    parser.add_argument("--worker-id")
    parser.add_argument("--deadline", type=float, default=120.0)
    ns = parser.parse_args()

    store = open_store(ns.url)
    worker = Worker(
        store,
        REGISTRY,
        lease_seconds=ns.lease,
        worker_id=ns.worker_id,
        poll_seconds=0.05,
        step_concurrency=ns.step_concurrency,
    )
    summary: dict[str, object] = {}
    try:
        if ns.job:
            summary["status"] = worker.run_once(ns.job)
        else:
            end = time.monotonic() + ns.deadline
            while True:
                worker.run(until_idle=True, concurrency=ns.concurrency)
                if not ns.until_done:
                    break
                left = store.list_jobs(JobFilter(status=["pending", "running"], limit=1))
                if not left or time.monotonic() > end:
                    break
                time.sleep(0.05)  # a dead worker's lease has not expired yet
        summary["jobs_run"] = worker.jobs_run
    finally:
        store.close()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
