"""A worker whose clock is too far from a shared database server's refuses to claim: workers
judge each other's leases by their own clocks. Real worker processes whose clocks really are
off (``libfaketime`` shifts what the process reads from the system clock), against a real
server; both backends (SQLite: one host, one clock — nothing to refuse)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import libfaketime
import psycopg
import pytest

from affidavit.store import open_store
from tests.cli.test_cli import cli, cli_env, json_of
from tests.conftest import PG_URL
from tests.runtime.helpers import node, plan

TOOLS = """
from affidavit import tool

@tool("stamp")
def stamp(ctx):
    return {"stamped": ctx.node_id}
"""


def shifted(seconds: str) -> dict[str, str]:
    """The environment of a process whose wall clock reads ``seconds`` (``+30s``) off."""
    return {**libfaketime.get_reload_information()[1], "FAKETIME": seconds}


def submitted(store_url: str, tmp_path: Path) -> tuple[str, Path]:
    tools = tmp_path / "stamp_tools.py"
    tools.write_text(TOOLS)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan(node("a", "stamp"))))
    result = cli("submit", str(plan_file), "--tools", str(tools), "--db", store_url, "--json")
    assert result.returncode == 0, result.stderr
    return json_of(result)["job_id"], tools


def job(store_url: str, job_id: str) -> Any:
    return json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))


def test_the_clock_is_shifted_for_real() -> None:
    """The shift reaches the process (else the tests below would prove nothing)."""
    code = "import time; print(time.time())"
    run = [sys.executable, "-c", code]
    plain = float(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    ahead = subprocess.run(
        run, capture_output=True, text=True, check=True, env=cli_env(shifted("+30s"))
    )
    assert 25 < float(ahead.stdout) - plain < 60


@pytest.mark.parametrize("shift", ["+30s", "-30s"])
def test_a_worker_whose_clock_is_off_claims_nothing(
    store_url: str, tmp_path: Path, shift: str
) -> None:
    job_id, tools = submitted(store_url, tmp_path)
    args = ("worker", "--until-idle", "--tools", str(tools), "--db", store_url, "--json")
    off = cli(*args, env=cli_env(shifted(shift)))
    if store_url.startswith("sqlite"):  # the database is on this host: one clock
        assert off.returncode == 0, off.stderr
        assert json_of(off) == {"jobs_run": 1}
        assert job(store_url, job_id)["status"] == "completed"
        return
    assert off.returncode == 3, off.stdout + off.stderr  # (a setting: as a bad option)
    error = json_of(off)["error"]
    assert error["code"] == "clock_skew"
    # the offset as measured: this host's clock against the server's, within a second
    shown = float(error["message"].split("clock is ")[1].split(" s off")[0])
    assert abs(shown - float(shift[:-1])) < 1, error
    assert "2.50 s" in error["message"] and "NTP" in error["hint"]
    untouched = job(store_url, job_id)
    assert untouched["status"] == "pending" and untouched["event_count"] == 2
    assert untouched["lease_owner"] is None
    # a clock within a sixth of the lease of the server's runs the job
    near = cli(*args, env=cli_env(shifted("+1s")))
    assert near.returncode == 0, near.stderr
    assert json_of(near) == {"jobs_run": 1}
    assert job(store_url, job_id)["status"] == "completed"


def test_the_allowed_offset_grows_with_the_lease(store_url: str, tmp_path: Path) -> None:
    """30 s off is within a sixth of a 300-second lease; ``affidavit run`` checks as well."""
    job_id, tools = submitted(store_url, tmp_path)
    args = ("worker", "--until-idle", "--tools", str(tools), "--db", store_url, "--json")
    long_lease = cli(*args, "--lease-seconds", "300", env=cli_env(shifted("+30s")))
    assert long_lease.returncode == 0, long_lease.stderr
    assert job(store_url, job_id)["status"] == "completed"
    plan_file = tmp_path / "plan.json"
    ran = cli(
        "run", str(plan_file), "--tools", str(tools), "--db", store_url, "--json",
        env=cli_env(shifted("+30s")),
    )  # fmt: skip
    if store_url.startswith("sqlite"):
        assert ran.returncode == 0, ran.stderr
    else:
        assert ran.returncode == 3 and json_of(ran)["error"]["code"] == "clock_skew", ran.stderr


UNAVAILABLE_AT_START = """
import sys
from affidavit import ToolRegistry
from affidavit.core.errors import ClockSkewError, StoreUnavailable
from affidavit.runtime._worker import Worker
from affidavit.store import open_store

store = open_store(sys.argv[1])
real = store.clock_offset
calls = []

def clock_offset():
    calls.append(1)
    if len(calls) == 1:  # the database is unreachable when the worker starts
        raise StoreUnavailable("test: the server is restarting")
    return real()

store.clock_offset = clock_offset
try:
    Worker(store, ToolRegistry()).run(until_idle=True, concurrency=2)
except ClockSkewError as exc:
    print("refused after", len(calls), "readings:", exc.message)
    sys.exit(3)
print("ran")
"""


def test_a_worker_started_while_the_database_is_down_checks_at_its_first_claim(
    store_url: str, tmp_path: Path
) -> None:
    if store_url.startswith("sqlite"):
        pytest.skip("SQLite: one host, one clock (the check reads nothing)")
    job_id, _ = submitted(store_url, tmp_path)
    script = tmp_path / "worker.py"
    script.write_text(UNAVAILABLE_AT_START)
    result = subprocess.run(
        [sys.executable, str(script), store_url],
        capture_output=True,
        text=True,
        env=cli_env(shifted("+30s")),
        timeout=120,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    # the start's reading failed; a claim loop's (one per loop at most) refused
    assert int(result.stdout.split("refused after ")[1].split()[0]) in (2, 3), result.stdout
    store = open_store(store_url)
    try:
        assert store.get_job(job_id).status == "pending"
    finally:
        store.close()


def test_db_clock_reports_the_offset_as_a_worker_would_judge_it(
    empty_store_url: str, tmp_path: Path
) -> None:
    """``affidavit db clock``: what a worker on this host would find, before one starts. It
    writes nothing: a database not created yet is not created (the fixture's is not yet)."""
    here = cli("db", "clock", "--db", empty_store_url, "--json")
    assert here.returncode == 0, here.stderr
    if empty_store_url.startswith("sqlite"):
        assert not list(tmp_path.glob("*.db*")), list(tmp_path.iterdir())
    else:
        schema = empty_store_url.split("schema=")[1]
        with psycopg.connect(PG_URL) as conn:
            found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
            assert found.fetchall() == []
    doc = json_of(here)
    assert doc["ok"] is True and doc["problem"] is None
    assert doc["lease_seconds"] == 15 and doc["allowed_seconds"] == 2.5
    off = cli("db", "clock", "--db", empty_store_url, "--json", env=cli_env(shifted("+30s")))
    longer = cli(
        "db", "clock", "--db", empty_store_url, "--json", "--lease-seconds", "300",
        env=cli_env(shifted("+30s")),
    )  # fmt: skip
    if empty_store_url.startswith("sqlite"):
        assert doc["offset_seconds"] is None and doc["uncertainty_seconds"] is None
        assert off.returncode == 0 and json_of(off)["ok"] is True  # nothing to check
        return
    assert abs(doc["offset_seconds"]) < 0.5 and 0 <= doc["uncertainty_seconds"] < 0.5
    assert off.returncode == 1, off.stdout + off.stderr
    judged = json_of(off)
    assert judged["ok"] is False and abs(judged["offset_seconds"] - 30) < 1
    assert "at most 2.50 s off" in judged["problem"]
    assert longer.returncode == 0 and json_of(longer)["allowed_seconds"] == 50
    human = cli("db", "clock", "--db", empty_store_url, env=cli_env(shifted("+30s")))
    assert human.returncode == 1 and "clock too far off" in human.stderr
