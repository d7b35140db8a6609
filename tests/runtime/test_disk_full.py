"""The disk under an SQLite database fills up while a job runs (a real filesystem: a 1 MiB tmpfs
mounted for the test, grown afterwards as an operator would free space).

A write that does not fit fails whole: SQLite reports "database or disk is full", the run keeps
trying for its ``store_retry_seconds`` and then gives the job up, with at most the one step whose
tool had acted left in flight. Nothing already recorded is lost or damaged, and once there is
room again a worker recovers the job: the in-flight step is found by its reconcile hook (not run
again), the rest run, and every step acted exactly once.

SQLite only: the disk of the PostgreSQL server cannot be filled from a test (its writes failing
is the store-outage tests' subject).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry, tool
from affidavit.core.errors import StoreUnavailable
from affidavit.verify import verify_job
from tests.runtime.helpers import assert_log_sound, ledger_rows, of_type, wait_lease_expired

STEPS = 300
RECEIPT = "r" * 4000  # each step records ~4 KB twice (its result and the node's output)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"a small filesystem cannot be mounted here (root needed): {done.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def grow(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)


def payment_tools(side: Path) -> ToolRegistry:
    def charge(ctx: ToolContext, i: int, prev: Any = None) -> dict[str, Any]:
        with side.open("a", encoding="utf-8") as f:  # the world: outside the full disk
            f.write(json.dumps({"node": ctx.node_id, "key": ctx.external_key}) + "\n")
        return {"i": i, "receipt": RECEIPT}

    paid = tool("fill_charge")(charge)

    @paid.reconcile
    def _find(ctx: ToolContext, i: int, prev: Any = None) -> dict[str, Any] | None:
        for line in side.read_text(encoding="utf-8").splitlines():
            if json.loads(line)["key"] == ctx.external_key:
                return {"i": i, "receipt": RECEIPT}
        return None

    assert isinstance(paid, Tool)
    return ToolRegistry([paid])


def chain_plan() -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [
        {"id": "s0", "type": "tool", "tool": "fill_charge", "args": {"i": 0}}
    ]
    for k in range(1, STEPS):
        nodes.append(
            {
                "id": f"s{k}",
                "type": "tool",
                "tool": "fill_charge",
                "args": {"i": k, "prev": f"${{s{k - 1}.i}}"},
                "depends_on": [f"s{k - 1}"],
            }
        )
    return {"name": "disk-full", "nodes": nodes}


def acted(side: Path) -> Counter[str]:
    return Counter(json.loads(line)["node"] for line in side.read_text().splitlines())


def test_a_full_disk_loses_nothing_and_the_job_recovers(small_disk: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{small_disk / 'jobs.db'}"
    side = tmp_path / "payments.jsonl"
    side.touch()
    tools = payment_tools(side)
    with Runtime(url, tools=tools, lease_seconds=1, store_retry_seconds=1) as rt:
        job_id = rt.submit(chain_plan(), {}).job_id
        # (one run: a worker loop would keep claiming the job again while the disk is full,
        # as it rides out any outage)
        with pytest.raises(StoreUnavailable, match="disk is full") as raised:
            rt.run_job(job_id)
        assert "disk holding the database is full" in raised.value.hint  # says what to do
        job = rt.get_job(job_id)
        assert job.status == "running"  # given up, not finished: its lease runs out
        events = assert_log_sound(rt.store, job_id)
        finished = of_type(events, "node_finished")
        assert 10 < len(finished) < STEPS  # it ran until the disk was full, then stopped
        done = acted(side)
        assert set(done.values()) == {1}  # nothing acted twice
        in_flight = set(done) - {e["node_id"] for e in finished}
        assert len(in_flight) <= 1  # only the step whose record did not fit

    grow(small_disk)  # the operator frees space
    with Runtime(url, tools=tools, lease_seconds=1) as rt:
        wait_lease_expired(rt.store, job_id)
        assert rt.run_until_idle() == 1
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        assert acted(side) == Counter({f"s{k}": 1 for k in range(STEPS)})
        events = assert_log_sound(rt.store, job_id)
        closed = of_type(events, "tool_invocation_finished")
        caught_up = [f["node_id"] for f in closed if f["catch_up"]]
        assert set(caught_up) == in_flight  # found by reconcile, not run again
        assert {r.status for r in ledger_rows(rt.store, job_id)} == {"committed"}
        assert verify_job(rt.store, job_id).ok
