"""What a new user trips on, as they run it: the demo's closing hint works from the shell they
are in, and `verify` of a tampered record marks no hash as holding."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli import cli, cli_env, json_of
from tests.cli.test_hitl_cli import PLAN, TOOLS
from tests.cli.test_verify_cli import finished_job
from tests.verify.helpers import RawDb

BIN = Path(sys.executable).parent  # the virtual environment's bin directory


def _look(stdout: str) -> str:
    [line] = [x for x in stdout.splitlines() if x.startswith("look: ")]
    return line.removeprefix("look: ")


def test_the_demos_hint_runs_as_printed_without_an_activated_environment(tmp_path: Path) -> None:
    home = BIN.parent.parent  # where `make demo` runs: the directory holding .venv
    bare = {**cli_env(), "TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    ran = cli("demo", env=bare, cwd=home)
    assert ran.returncode == 0, ran.stderr
    command = _look(ran.stdout)
    expected = str((BIN / "affidavit").relative_to(home))  # .venv/bin/affidavit
    assert command.startswith(f"{expected} jobs events ")
    shown = subprocess.run(
        shlex.split(command), cwd=home, env=bare, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr  # the hint works as printed
    assert "job_created" in shown.stdout

    activated = {**bare, "PATH": f"{BIN}{os.pathsep}/usr/bin:/bin"}
    again = cli("demo", env=activated, cwd=home)
    assert _look(again.stdout).startswith("affidavit jobs events ")


def test_verify_marks_no_hash_as_holding_when_the_record_does_not_verify(
    store_url: str, tmp_path: Path
) -> None:
    job_id = finished_job(store_url, tmp_path)
    good = cli("verify", job_id, "--db", store_url)
    assert good.returncode == 0
    for name in ("execution_hash", "event_chain_root_hash"):
        [line] = [x for x in good.stdout.splitlines() if name in x]
        assert "✓" in line
    raw = RawDb(store_url)
    version, _, _, payload, _ = raw.events(job_id)[4]
    raw.set_payload(job_id, version, payload.replace(b"}", b" }", 1))  # same JSON, other bytes
    bad = cli("verify", job_id, "--db", store_url)
    assert bad.returncode == 1
    for name in ("execution_hash", "event_chain_root_hash"):
        [line] = [x for x in bad.stdout.splitlines() if name in x]
        assert "✓" not in line and "?" in line, line
    assert "not the record's" in bad.stdout


def test_a_trace_names_what_answered_an_approval_and_what_a_wait_is(
    store_url: str, tmp_path: Path
) -> None:
    tools, plan = tmp_path / "report_tools.py", tmp_path / "report.json"
    tools.write_text(TOOLS)
    plan.write_text(json.dumps(PLAN))
    ran = cli("run", str(plan), "--tools", str(tools), "--input",
              json.dumps({"path": str(tmp_path / "r")}), "--db", store_url, "--json")  # fmt: skip
    job_id = json_of(ran)["job_id"]
    trace = json_of(cli("jobs", "trace", job_id, "--db", store_url, "--json"))
    assert trace["waiting_for"] == [
        {"node_id": "ok", "wait_type": "approval", "correlation_key": f"{job_id}:ok"}
    ]  # as `jobs show` gives it
    assert {n["id"]: n["state"] for n in trace["nodes"]}["ok"] == "waiting"
    approve = ("--payload", '{"approved": true}', "--as", "ann")
    assert (
        cli("signal", job_id, "--key", f"{job_id}:ok", *approve, "--db", store_url).returncode == 0
    )
    assert cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url).returncode == 0
    done = json_of(cli("jobs", "trace", job_id, "--db", store_url, "--json"))
    ok = {n["id"]: n for n in done["nodes"]}["ok"]
    assert (ok["state"], ok["outcome"]) == ("approved", "pure")  # not shown as a computation
    human = cli("jobs", "trace", job_id, "--db", store_url).stdout
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in human.splitlines()]
    [row] = [c for c in cells if c[:1] == ["ok"]]
    assert row[1:3] == ["approval", "approved"], row
