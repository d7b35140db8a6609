"""The disk under the database fills up while a job runs, on SQLite and PostgreSQL — a real
filesystem: a 2 MiB tmpfs mounted for the test (SQLite: the database file's directory;
PostgreSQL: a tablespace the test's tables are created in, through the connection's
``default_tablespace``), grown afterwards as an operator would free space.

A write that does not fit fails whole: the database reports a full disk ("database or disk is
full", "could not extend file: No space left on device"), the run keeps trying for its
``store_retry_seconds`` and then gives the job up, with at most the one step whose tool had acted
left in flight. Nothing already recorded is lost or damaged, and once there is room again a
worker recovers the job: the in-flight step is found by its reconcile hook (not run again), the
rest run, and every step acted exactly once.

Needs root (to mount) and, for PostgreSQL, a server on this machine (the tablespace's directory
is the server's); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry, tool
from affidavit.core.errors import StoreUnavailable
from affidavit.verify import verify_job
from tests.conftest import BACKENDS, PG_URL, drop_schema, with_schema
from tests.runtime.helpers import assert_log_sound, ledger_rows, of_type, wait_lease_expired

STEPS = 600


def receipt() -> str:
    """~4 KB that do not compress (PostgreSQL compresses large values), recorded twice per
    step (the tool's result and the node's output)."""
    return secrets.token_hex(2000)


def _mount_small(where: Path) -> None:
    where.mkdir(exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        where.rmdir()
        pytest.skip(f"a small filesystem cannot be mounted here (root needed): {done.stderr}")


@pytest.fixture(params=BACKENDS)
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(the URL of an empty database on a 2 MiB disk, that disk's mount point)"""
    mount = tmp_path / "small"
    if request.param == "sqlite":
        _mount_small(mount)
        try:
            yield f"sqlite:///{mount / 'jobs.db'}", mount
        finally:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        return
    schema = request.getfixturevalue("pg_schema")
    # the server must reach the directory: one of its own in the system's temporary directory
    # (the test's is private to this user)
    mount = Path(tempfile.mkdtemp(prefix="affidavit-small-disk-"))
    _mount_small(mount)
    space = f"small_{uuid.uuid4().hex[:12]}"
    try:
        shutil.chown(mount, "postgres", "postgres")
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f"CREATE TABLESPACE {space} LOCATION '{mount}'")
    except (LookupError, OSError, psycopg.Error) as exc:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        mount.rmdir()
        pytest.skip(f"no tablespace on a small disk here (a local server is needed): {exc}")
    try:
        options = quote(f"-c default_tablespace={space}")
        yield f"{with_schema(PG_URL, schema)}&options={options}", mount
    finally:
        drop_schema(schema)  # (its tables live in the tablespace)
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f"DROP TABLESPACE IF EXISTS {space}")
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        mount.rmdir()


def grow(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)


def payment_tools(side: Path, name: str) -> ToolRegistry:
    def charge(ctx: ToolContext, i: int, prev: Any = None) -> dict[str, Any]:
        with side.open("a", encoding="utf-8") as f:  # the world: outside the full disk
            f.write(json.dumps({"node": ctx.node_id, "key": ctx.external_key}) + "\n")
        return {"i": i, "receipt": receipt()}

    paid = tool(name)(charge)

    @paid.reconcile
    def _find(ctx: ToolContext, i: int, prev: Any = None) -> dict[str, Any] | None:
        for line in side.read_text(encoding="utf-8").splitlines():
            if json.loads(line)["key"] == ctx.external_key:
                return {"i": i, "receipt": receipt()}
        return None

    assert isinstance(paid, Tool)
    return ToolRegistry([paid])


def chain_plan(tool_name: str) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [
        {"id": "s0", "type": "tool", "tool": tool_name, "args": {"i": 0}}
    ]
    for k in range(1, STEPS):
        nodes.append(
            {
                "id": f"s{k}",
                "type": "tool",
                "tool": tool_name,
                "args": {"i": k, "prev": f"${{s{k - 1}.i}}"},
                "depends_on": [f"s{k - 1}"],
            }
        )
    return {"name": "disk-full", "nodes": nodes}


def acted(side: Path) -> Counter[str]:
    return Counter(json.loads(line)["node"] for line in side.read_text().splitlines())


def test_a_full_disk_loses_nothing_and_the_job_recovers(
    small_disk: tuple[str, Path], tmp_path: Path
) -> None:
    url, mount = small_disk
    side = tmp_path / "payments.jsonl"
    side.touch()
    name = f"fill_charge_{uuid.uuid4().hex[:8]}"  # (a tool name is registered once a process)
    tools = payment_tools(side, name)
    options = {"lease_seconds": 1, "store_retry_seconds": 1, "max_outage_seconds": 3}
    with Runtime(url, tools=tools, **options) as rt:
        job_id = rt.submit(chain_plan(name), {}).job_id
        # the worker's loop: its run gives up, it claims the job again once the lease expired
        # (when a claim still fits), and gives up for good after max_outage_seconds
        with pytest.raises(StoreUnavailable, match=r"disk is full|No space left") as raised:
            rt.run_until_idle()
        assert "gave up" in raised.value.message
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

    grow(mount)  # the operator frees space
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
