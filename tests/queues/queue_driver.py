"""A worker process for the queue fleet tests (run as a real subprocess).

    python queue_driver.py URL --lease S [--concurrency N] [--queue Q ...]

Runs the tools of :mod:`tests.queues.queue_tools` until no job is pending or running (waiting
for the expired leases of dead workers), then prints a JSON summary.
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
from tests.queues.queue_tools import REGISTRY


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--lease", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--queue", action="append")
    parser.add_argument("--deadline", type=float, default=120.0)
    ns = parser.parse_args()
    store = open_store(ns.url)
    worker = Worker(store, REGISTRY, lease_seconds=ns.lease, poll_seconds=0.02, queues=ns.queue)
    try:
        end = time.monotonic() + ns.deadline
        while time.monotonic() < end:
            worker.run(until_idle=True, concurrency=ns.concurrency)
            if not store.list_jobs(JobFilter(status=["pending", "running"], limit=1)):
                break
            time.sleep(0.02)  # limits, or a dead worker's lease: not runnable yet
        print(json.dumps({"jobs_run": worker.jobs_run}), flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    main()
