"""A retention run killed (SIGKILL) at each of its crash points, on both backends, loses
nothing: the job is either whole in the live store or archived with a pack that verifies, and
the next run finishes the work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from affidavit.packs import verify_pack
from affidavit.retention import Retention, check_archived, set_policy
from affidavit.store import open_store
from affidavit.verify import verify_job
from tests.cli.test_cli import SRC
from tests.retention.helpers import finished_jobs, removed_rows

DRIVER = Path(__file__).with_name("driver.py")


def killed_at(url: str, point: str) -> None:
    env = {**os.environ, "PYTHONPATH": SRC, "AFFIDAVIT_CRASH_AT": point}
    done = subprocess.run(
        [sys.executable, str(DRIVER), url], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize(
    ("point", "removed"),
    [
        ("retention.after_pack_written", False),
        ("retention.after_pack_verified", False),
        ("retention.before_delete_commit", False),
        ("retention.after_delete_commit", True),
    ],
)
def test_a_kill_at_each_point_loses_nothing(
    store_url: str, tmp_path: Path, point: str, removed: bool
) -> None:
    (job_id,) = finished_jobs(store_url, 1)
    store = open_store(store_url)
    try:
        before = removed_rows(store, job_id)
        set_policy(store, 0, tmp_path)
    finally:
        store.close()
    killed_at(store_url, point)
    pack = tmp_path / f"pack-{job_id}.tar.gz"
    assert pack.is_file()  # written whole before each point
    store = open_store(store_url)
    try:
        if removed:
            checked = check_archived(store, job_id)
            assert checked is not None and checked.ok
        else:
            assert removed_rows(store, job_id) == before  # whole, no tombstone
            assert verify_job(store, job_id).ok
        assert not list(tmp_path.glob(".pack-*"))  # no staging file left behind
        # the dead run's lease runs out; the next run finishes the work
        # (the driver's clock is 10 days ahead, its lease 60 s)
        report = Retention(store, clock=lambda: time.time() + 10 * 86_400 + 120).run()
        assert list(report.archived) == ([] if removed else [job_id])
        checked = check_archived(store, job_id)
        assert checked is not None and checked.ok and checked.pack_present
        assert verify_pack(pack).ok
        assert removed_rows(store, job_id)["events"] == 0
    finally:
        store.close()
