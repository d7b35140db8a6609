"""Crash loops: a step that kills its worker (here: SIGKILL of its own process, as the kernel's
out-of-memory killer would) is recovered ``--max-recoveries`` times, then the job is parked as
``crash_loop`` instead of taking down every worker that picks it up; a person resumes it
(``retry`` once the cause is fixed, or ``fail``). Real worker processes, both backends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from affidavit.store import open_store
from affidavit.verify import verify_job
from tests.cli.test_cli import cli, cli_process
from tests.runtime.helpers import assert_log_sound, ledger_rows, of_type, wait_lease_expired

LIMIT = 2  # --max-recoveries

TOOLS = """
import os, signal
from pathlib import Path
from affidavit import pure, tool

HERE = Path(__file__).parent

def _poison(name):
    with open(HERE / "calls.txt", "a") as f:
        f.write(name + "\\n")
    if not (HERE / "fixed").exists():
        os.kill(os.getpid(), signal.SIGKILL)
    return {"done": name}

@tool("prepare")
def prepare(ctx):
    return {"ok": True}

@pure("poison_pure")
def poison_pure(ctx):
    return _poison("poison_pure")

@tool("poison_tool")
def poison_tool(ctx):
    return _poison("poison_tool")

@poison_tool.reconcile
def _(ctx):
    return None  # the effect is never found: each recovery runs the tool again
"""


def plan_file(tmp: Path, kind: str) -> Path:
    path = tmp / "plan.json"
    nodes = [
        {"id": "prepare", "type": "tool", "tool": "prepare"},
        {"id": "poison", "type": kind, "tool": f"poison_{kind}", "depends_on": ["prepare"]},
    ]
    path.write_text(json.dumps({"name": "crash-loop", "nodes": nodes}))
    return path


def calls(tmp: Path) -> int:
    path = tmp / "calls.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("kind", ["pure", "tool"])
def test_a_step_that_kills_its_worker_parks_the_job_after_the_limit(
    store_url: str, tmp_path: Path, kind: str
) -> None:
    tools = tmp_path / "poison_tools.py"
    tools.write_text(TOOLS)
    db = ("--db", store_url)
    common = ("--tools", str(tools), *db)
    submitted = cli("submit", str(plan_file(tmp_path, kind)), *common)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    work = ("worker", "--until-idle", "--lease-seconds", "0.5", "--max-recoveries", str(LIMIT))

    store = open_store(store_url)
    try:
        for run in range(LIMIT + 1):  # the first run and LIMIT recoveries: each killed
            killed = cli_process(*work, *common)
            assert killed.returncode == -9, (run, killed.stderr)
            assert calls(tmp_path) == run + 1
            wait_lease_expired(store, job_id)
        parks = cli_process(*work, *common, "--json")
        assert parks.returncode == 0, parks.stderr
        assert calls(tmp_path) == LIMIT + 1  # parked, not run again
        job = store.get_job(job_id)
        assert job.status == "parked" and job.lease_owner is None
        events = assert_log_sound(store, job_id)
        [parked] = of_type(events, "job_parked")
        assert parked["reason"] == "crash_loop" and parked["node_id"] == "poison"
        assert parked["detail"]["recoveries"] == LIMIT + 1
        assert parked["detail"]["max_recoveries"] == LIMIT
        if kind == "tool":  # the last killed invocation stays open until a person decides
            assert [r.status for r in ledger_rows(store, job_id) if r.node_id == "poison"] == [
                "started"
            ]
        result = verify_job(store, job_id)
        assert result.ok and result.tool_invocation_ledger_proof.ok

        refused = cli("resume", job_id, "--decision", "accept_result", "--result", "{}", *db)
        assert refused.returncode == 3 and "crash_loop" in refused.stderr
        (tmp_path / "fixed").touch()  # the cause is fixed: a person retries
        resumed = cli("resume", job_id, "--decision", "retry", *db, "--json")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["status"] == "pending"
        finished = cli_process(*work, *common)
        assert finished.returncode == 0, finished.stderr
    finally:
        store.close()
    check_completed(store_url, job_id, kind)
    assert calls(tmp_path) == LIMIT + 2


def check_completed(store_url: str, job_id: str, kind: str) -> None:
    store = open_store(store_url)
    try:
        job = store.get_job(job_id)
        assert job.status == "completed", job.error
        assert job.output == {"poison": {"done": f"poison_{kind}"}}
        events = assert_log_sound(store, job_id)
        assert [p["decision"] for p in of_type(events, "job_resumed")] == ["retry"]
        assert verify_job(store, job_id).ok
    finally:
        store.close()


def test_a_crash_looping_job_failed_by_a_person_closes_its_open_invocation(
    store_url: str, tmp_path: Path
) -> None:
    tools = tmp_path / "poison_tools.py"
    tools.write_text(TOOLS)
    db = ("--db", store_url)
    common = ("--tools", str(tools), *db)
    job_id = cli("submit", str(plan_file(tmp_path, "tool")), *common).stdout.strip()
    work = ("worker", "--until-idle", "--lease-seconds", "0.5", "--max-recoveries", "0")
    store = open_store(store_url)
    try:
        assert cli_process(*work, *common).returncode == -9
        wait_lease_expired(store, job_id)
        assert cli_process(*work, *common).returncode == 0  # the first recovery is one too many
        assert store.get_job(job_id).status == "parked"
        failed = cli("resume", job_id, "--decision", "fail", *db, "--json")
        assert failed.returncode == 0, failed.stderr
        doc: dict[str, Any] = json.loads(failed.stdout)
        assert doc["status"] == "failed" and doc["error"]["type"] == "crash_loop"
        events = assert_log_sound(store, job_id)
        [closed] = [
            p for p in of_type(events, "tool_invocation_finished") if p["node_id"] == "poison"
        ]
        assert closed["outcome"] == "unknown"  # it may have acted (it did): never lost
        assert verify_job(store, job_id).ok
    finally:
        store.close()
    assert calls(tmp_path) == 1


def test_a_step_that_exits_says_so(store_url: str, tmp_path: Path) -> None:
    """``sys.exit`` inside a step ends the run as a crash would (the job is recovered later);
    the worker says which step did it instead of ending silently with the tool's exit code."""
    tools = tmp_path / "exit_tools.py"
    tools.write_text(
        "import sys\nfrom affidavit import pure\n\n"
        "@pure('quits')\ndef quits(ctx):\n    sys.exit(3)\n"
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"nodes": [{"id": "q", "type": "pure", "tool": "quits"}]}))
    ran = cli_process(
        "run", str(plan), "--tools", str(tools), "--db", store_url, "--lease-seconds", "1"
    )
    assert ran.returncode == 3
    assert "step 'q' raised SystemExit(3), which ends the run as a crash would" in ran.stderr


LITE_TOOLS = """
from affidavit import tool

@tool("prepare")
def prepare(ctx):
    return {"ok": True}
"""


def test_a_worker_without_the_tools_does_not_reset_the_count(
    store_url: str, tmp_path: Path
) -> None:
    """A worker that lacks a tool the job needs hands a recovered job back untouched: the next
    worker that can run it still recovers it, and counts on, so that a fleet of mixed workers
    (one started for other jobs, which claims this one once) does not hide a crash loop."""
    tools = tmp_path / "poison_tools.py"
    tools.write_text(TOOLS)
    lite = tmp_path / "lite_tools.py"
    lite.write_text(LITE_TOOLS)
    db = ("--db", store_url)
    job_id = cli("submit", str(plan_file(tmp_path, "pure")), "--tools", str(tools), *db)
    job_id = job_id.stdout.strip()
    work = ("worker", "--until-idle", "--lease-seconds", "0.5", "--max-recoveries", str(LIMIT))
    store = open_store(store_url)
    try:
        for run in range(LIMIT + 1):  # the first run and LIMIT recoveries: each killed
            killed = cli_process(*work, "--tools", str(tools), *db)
            assert killed.returncode == -9, (run, killed.stderr)
            wait_lease_expired(store, job_id)
            # a worker without poison_pure claims the job and hands it back
            handed = cli_process(*work, "--tools", str(lite), *db)
            assert handed.returncode == 0, handed.stderr
            assert store.get_job(job_id).status == "running"
        parks = cli_process(*work, "--tools", str(tools), *db)
        assert parks.returncode == 0, parks.stderr
        assert calls(tmp_path) == LIMIT + 1  # parked, not run again
        assert store.get_job(job_id).status == "parked"
        [parked] = of_type(assert_log_sound(store, job_id), "job_parked")
        assert parked["reason"] == "crash_loop"
        assert parked["detail"]["recoveries"] == LIMIT + 1
        assert verify_job(store, job_id).ok
    finally:
        store.close()


def test_a_loop_while_finishing_the_job_parks_without_blaming_a_completed_step(
    store_url: str, tmp_path: Path
) -> None:
    """Every step completed and each run dies completing the job (crash point
    ``job.before_complete``): the park names the last node, as the format needs a node, but
    says the runs died finishing the job, and the trace keeps that node's outcome instead of
    showing it as the step to decide about."""
    lite = tmp_path / "lite_tools.py"
    lite.write_text(LITE_TOOLS)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"nodes": [{"id": "prepare", "type": "tool", "tool": "prepare"}]}))
    common = ("--tools", str(lite), "--db", store_url)
    job_id = cli("submit", str(plan), *common).stdout.strip()
    work = ("worker", "--until-idle", "--lease-seconds", "0.5", "--max-recoveries", "1")
    store = open_store(store_url)
    try:
        for run in range(2):  # the first run and one recovery: each killed
            killed = cli_process(*work, *common, env={"AFFIDAVIT_CRASH_AT": "job.before_complete"})
            assert killed.returncode == -9, (run, killed.stderr)
            wait_lease_expired(store, job_id)
        parks = cli_process(*work, *common)
        assert parks.returncode == 0, parks.stderr
        assert store.get_job(job_id).status == "parked"
        [parked] = of_type(assert_log_sound(store, job_id), "job_parked")
        assert parked["reason"] == "crash_loop" and parked["node_id"] == "prepare"
        assert "exited while finishing the job" in parked["detail"]["message"]
        trace = json.loads(cli("jobs", "trace", job_id, "--db", store_url, "--json").stdout)
        [node] = trace["nodes"]
        assert node["state"] == "side_effect_committed"
        assert trace["parked"]["reason"] == "crash_loop"
        resumed = cli("resume", job_id, "--decision", "retry", "--db", store_url)
        assert resumed.returncode == 0, resumed.stderr
        assert cli_process(*work, *common).returncode == 0
        assert store.get_job(job_id).status == "completed"
        assert [r.status for r in ledger_rows(store, job_id)] == ["committed"]  # ran once
        assert verify_job(store, job_id).ok
    finally:
        store.close()
