"""The worst day on SQLite: a worker dies in the middle of a job (SIGKILL right after a tool
acted, before its record), and the filesystem holding the database is then read-only (remounted
so, as after disk errors or by an operator) while workers start again, then writable again.

While it is read-only a worker fails with an error that says so — exit 3, no traceback — and
changes nothing; the record so far is whole. Once it is writable again the job resumes: the
step in flight is found by reconcile, never run again, every step acted once, and the job
verifies. (A full disk: ``tests/runtime/test_disk_full.py``, on both backends.)

Needs root (to mount); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.verify import verify_job
from tests.runtime.crash_tools import REGISTRY, counts
from tests.runtime.helpers import assert_log_sound, ledger_rows, of_type, wait_lease_expired

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]
STEPS = 30
FREEZE_AT = 12  # the step left in flight


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"a filesystem cannot be mounted here (root needed): {done.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _remount(where: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], check=True)


def _plan() -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    for k in range(STEPS):
        node: dict[str, Any] = {
            "id": f"s{k}",
            "type": "tool",
            "tool": "crash_charge",
            "args": {"side": "${input.side}", "amount": k},
        }
        if k:
            node["depends_on"] = [f"s{k - 1}"]
        nodes.append(node)
    return {"name": "read-only", "nodes": nodes}


def _worker(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "affidavit",
            "worker",
            "--until-idle",
            "--db",
            url,
            "--tools",
            "tests.runtime.crash_tools",
            "--lease-seconds",
            "1",
            "--max-outage-seconds",
            "5",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_database_made_read_only_mid_run_loses_nothing_and_the_job_resumes(
    mount: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{mount / 'jobs.db'}"
    side = tmp_path / "payments.jsonl"
    with Runtime(url, tools=REGISTRY) as rt:
        job_id = rt.submit(_plan(), {"side": str(side)}).job_id
    # the worker dies right after the tool of step FREEZE_AT acted, before its record
    died = _worker(url, AFFIDAVIT_CRASH_AT=f"tool.after_execute:{FREEZE_AT + 1}")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert counts(side, "charge") == Counter({(job_id, f"s{k}"): 1 for k in range(FREEZE_AT + 1)})

    # The dead worker's 1 s lease runs out first, so the next worker must write to claim the
    # job. (Not read through a store: closing one would checkpoint away the -wal file the dead
    # worker left, and the database would then fail to open at all on the read-only mount.)
    time.sleep(2.0)
    _remount(mount, "ro")
    before = {p.name: p.read_bytes() for p in mount.iterdir()}
    refused = _worker(url)
    assert refused.returncode == 3, refused.stderr
    assert "Traceback" not in refused.stderr
    assert "read-only" in refused.stderr.lower() or "readonly" in refused.stderr.lower(), (
        refused.stderr
    )
    assert {p.name: p.read_bytes() for p in mount.iterdir()} == before  # nothing changed
    assert len(counts(side, "charge")) == FREEZE_AT + 1  # no tool called

    _remount(mount, "rw")
    with Runtime(url, tools=REGISTRY, lease_seconds=1) as rt:
        wait_lease_expired(rt.store, job_id)
    resumed = _worker(url)
    assert resumed.returncode == 0, resumed.stderr
    with Runtime(url, tools=REGISTRY) as rt:
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        assert counts(side, "charge") == Counter({(job_id, f"s{k}"): 1 for k in range(STEPS)})
        events = assert_log_sound(rt.store, job_id)
        closed = of_type(events, "tool_invocation_finished")
        assert [f["node_id"] for f in closed if f["catch_up"]] == [f"s{FREEZE_AT}"]
        assert {r.status for r in ledger_rows(rt.store, job_id)} == {"committed"}
        assert verify_job(rt.store, job_id).ok
