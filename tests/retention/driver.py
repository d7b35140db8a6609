"""A retention run in a process of its own (``python driver.py URL``), as a worker runs it: the
crash tests set ``AFFIDAVIT_CRASH_AT`` to kill it at a named point."""

from __future__ import annotations

import sys
import time

from affidavit.retention import Retention
from affidavit.store import open_store

if __name__ == "__main__":
    store = open_store(sys.argv[1])
    try:
        report = Retention(store, clock=lambda: time.time() + 10 * 86_400).run()
        print(len(report.archived))
    finally:
        store.close()
