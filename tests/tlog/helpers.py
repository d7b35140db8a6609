"""Sealed jobs made quickly (no plan run), and a log key in the test's directory."""

from __future__ import annotations

from pathlib import Path

from affidavit.core.events import utc_now
from affidavit.record._sealing import Sealer
from affidavit.store import NewEvent, Store
from affidavit.tlog import LogKey
from tests.verify.helpers import RawDb


def seal_jobs(store: Store, sealer: Sealer, n: int, *, note: str = "") -> list[str]:
    """``n`` completed jobs of two events each, sealed as the runtime seals (the seal and its
    log leaf in the transaction that ends the job)."""
    ids: list[str] = []
    for i in range(n):
        job, _ = store.create_job(
            plan_name="tlog-test",
            events=[NewEvent("job_created", {"at": utc_now(), "input": {"i": i, "note": note}})],
        )
        with store.transaction() as tx:
            tx.append(
                job.job_id,
                [NewEvent("job_completed", {"at": utc_now(), "output": {}})],
                expected_version=1,
            )
            tx.update_job(job.job_id, status="completed")
            sealer.seal_txn(tx, job.job_id)
        ids.append(job.job_id)
    return ids


def log_key(tmp_path: Path) -> LogKey:
    return LogKey(tmp_path / "keys" / "affidavit-log.key")


def drop_guards(url: str) -> None:
    """What an operator with the database does first: drop the triggers of migration 13 (one
    leaf per job in the log; a logged seal never changes)."""
    raw = RawDb(url)
    if url.startswith("sqlite:///"):
        for name in ("tlog_leaves_one_per_job", "seals_logged_no_update", "seals_logged_no_delete"):
            raw.execute(f"DROP TRIGGER {name}")
    else:
        raw.execute("DROP TRIGGER tlog_leaves_one_per_job ON tlog_leaves")
        raw.execute("DROP TRIGGER seals_logged_fixed ON seals")
