"""``affidavit schedules ...`` and the scheduler of a real ``affidavit worker``, both backends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from affidavit.store import open_store
from tests.cli.test_cli import cli, cli_env
from tests.cli.test_refusals_cli import database_exists

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "tests.runtime.sched_tools"


def _json(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, (result.stdout, result.stderr)
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_a_schedule_fires_from_a_worker_and_lists_its_runs(store_url: str, tmp_path: Path) -> None:
    added = _json(
        cli(
            "schedules", "add", "pulse", "--every", "1s", "--agent", "sched_agent",
            "--tools", TOOLS, "--input", json.dumps({"dir": str(tmp_path)}), "--queue", "llm",
            "--catch-up", "all", "--db", store_url, "--json", cwd=ROOT,
        )
    )  # fmt: skip
    assert added["every_seconds"] == 1 and added["queue"] == "llm"
    assert added["target"] == {"kind": "agent", "name": "sched_agent"}
    listed = _json(cli("schedules", "list", "--db", store_url, "--json"))
    assert [(s["name"], s["queue"], s["catch_up"]) for s in listed["schedules"]] == [
        ("pulse", "llm", "all")
    ]
    # the schedule's jobs go to its queue: one the database knows, with its limits
    assert cli("queues", "set", "llm", "--concurrency", "2", "--db", store_url).returncode == 0
    worker = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "worker", "--db", store_url, "--tools", TOOLS],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        runs: list[dict[str, Any]] = []
        while len(runs) < 2:
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.5)
            runs = _json(cli("schedules", "runs", "pulse", "--db", store_url, "--json"))["runs"]
    finally:
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert all(r["idempotency_key"] == f"schedule:pulse:{r['slot']}" for r in runs)
    assert [r["slot"] for r in runs] == sorted((r["slot"] for r in runs), reverse=True)
    # (a slot fired just before the stop may not have run yet: an idle run finishes it)
    idle = cli(
        "worker", "--until-idle", "--tools", TOOLS, "--db", store_url, cwd=ROOT,
        env={**cli_env(), "AFFIDAVIT_SCHEDULER": "off"},
    )  # fmt: skip
    assert idle.returncode == 0, idle.stderr
    for r in runs:
        shown = _json(cli("jobs", "show", r["job_id"], "--db", store_url, "--json"))
        assert shown["status"] == "completed"
    store = open_store(store_url)
    try:
        with store.transaction(durable=False) as tx:
            queues = {
                row[0]
                for r in runs
                for row in tx.query("SELECT queue FROM jobs WHERE job_id = ?", (r["job_id"],))
            }
    finally:
        store.close()
    assert queues == {"llm"}
    assert _json(cli("schedules", "pause", "pulse", "--db", store_url, "--json"))["paused"]
    resumed = _json(cli("schedules", "resume", "pulse", "--db", store_url, "--json"))
    assert not resumed["paused"] and resumed["next_slot"] is not None
    text = cli("schedules", "list", "--db", store_url)
    assert "pulse" in text.stdout and "every 1s" in text.stdout and "llm" in text.stdout
    assert _json(cli("schedules", "delete", "pulse", "--db", store_url, "--json")) == {
        "deleted": "pulse"
    }
    gone = cli("schedules", "runs", "pulse", "--db", store_url)
    assert gone.returncode == 2 and "not found" in gone.stderr


@pytest.mark.parametrize(
    ("args", "says", "hint"),
    [
        (("--cron", "0 25 * * *"), "invalid cron expression", "Five fields"),
        (("--cron", "0 2 * * *", "--timezone", "Mars/Base"), "unknown time zone", "IANA"),
        (("--every", "1w"), "--every", "30s, 5m, 2h or 1d"),
        (("--every", "1s", "--cron", "* * * * *"), "not both", "--every 30s"),
    ],
)
def test_a_bad_schedule_is_refused_and_no_database_is_made(
    empty_store_url: str, args: tuple[str, ...], says: str, hint: str
) -> None:
    result = cli(
        "schedules", "add", "nightly", *args, "--agent", "sched_agent", "--tools", TOOLS,
        "--input", '{"dir": "/tmp"}', "--db", empty_store_url, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert says in result.stderr and hint in result.stderr
    assert "Traceback" not in result.stderr
    assert not database_exists(empty_store_url)


def test_an_unknown_agent_is_refused_and_no_database_is_made(empty_store_url: str) -> None:
    result = cli(
        "schedules", "add", "nightly", "--every", "1h", "--agent", "nope", "--tools", TOOLS,
        "--db", empty_store_url, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 3 and "agent 'nope' is not registered" in result.stderr
    hint = next(line for line in result.stderr.splitlines() if "Registered agents:" in line)
    assert "sched_agent" in hint  # (in-process, agents other test modules registered too)
    assert not database_exists(empty_store_url)
