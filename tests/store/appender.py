"""Run as a separate process by the concurrency tests: append N events to one job, retrying on
version conflicts, and print how many conflicts it saw."""

from __future__ import annotations

import sys

from affidavit.core.errors import ConflictError
from affidavit.store import NewEvent, open_store


def main() -> None:
    url, job_id, worker, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = open_store(url)
    conflicts = 0
    done = 0
    try:
        while done < count:
            version = store.get_job(job_id).version
            try:
                store.append(
                    job_id,
                    [NewEvent("node_started", {"worker": worker, "i": done})],
                    expected_version=version,
                    durable=done % 2 == 0,
                )
                done += 1
            except ConflictError:
                conflicts += 1
    finally:
        store.close()
    print(conflicts)


if __name__ == "__main__":
    main()
