"""``affidavit db migrate`` killed (SIGKILL) while it rebuilds the events table, on SQLite and
PostgreSQL: every pending migration is applied in one transaction, so the database is left
exactly as it was — the older schema, every event in place — and the next open migrates it.

The database is made a version-5 one (tests/store/legacy.py) holding 100 logs of 1,000 events;
migration 6 copies every event into a rebuilt table, and the process is killed as soon as it
says it is applying that migration.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from affidavit.core.chain import check_stored_chain
from affidavit.store import NewEvent, open_store
from tests.cli.test_cli import cli_env
from tests.store.legacy import undo_migration_6

JOBS, EVENTS = 100, 1000  # migration 6 then takes ~0.6 s here: time for the kill to land in it


def test_a_migration_killed_midway_changes_nothing(store_url: str) -> None:
    store = open_store(store_url)
    try:
        heads: dict[str, tuple[int, str | None]] = {}
        for j in range(JOBS):
            job, _ = store.create_job(events=[NewEvent("job_created", {"input": {"j": j}})])
            store.append(
                job.job_id,
                [
                    NewEvent("node_started", {"node_id": f"n{i}", "note": "x" * 200})
                    for i in range(EVENTS - 1)
                ],
                expected_version=1,
            )
            after = store.get_job(job.job_id)
            heads[job.job_id] = (after.version, after.head_hash)
        latest = store.schema_version()
    finally:
        store.close()
    undo_migration_6(store_url)

    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "db", "migrate", "--db", store_url],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=cli_env(),
    )
    assert proc.stderr is not None
    said = ""
    for line in proc.stderr:
        said += line
        if "applying migration 6" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, said  # killed inside the migration

    before = open_store(store_url, migrate=False)
    try:
        assert before.schema_version() == 5  # nothing of the interrupted migrations stayed
    finally:
        before.close()
    store = open_store(store_url)  # migrates
    try:
        assert store.schema_version() == latest
        for job_id, (version, head) in heads.items():
            events = store.list_events(job_id)
            assert len(events) == version == EVENTS
            check = check_stored_chain(
                (e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash) for e in events
            )
            assert check.ok and check.root == head == store.get_job(job_id).head_hash
    finally:
        store.close()
