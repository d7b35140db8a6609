"""What `run` (and `jobs show`, `jobs wait`, `signal`, `resume`) print for a person: a job left
waiting or parked ends with the `next:` command that moves it on, as `jobs show` gives it; an
output of megabytes is cut with a note, not laid out by Rich for a minute — on both backends."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli import cli, json_of
from tests.cli.test_hitl_cli import PLAN, TOOLS

ECHO_TOOLS = """
from affidavit import pure

@pure("echo")
def echo(ctx, **args):
    return args
"""
ECHO_PLAN = {
    "name": "echo",
    "nodes": [{"id": "e", "type": "pure", "tool": "echo", "args": {"v": "${input.v}"}}],
}


def test_run_that_ends_waiting_or_parked_prints_the_next_command(
    store_url: str, tmp_path: Path
) -> None:
    tools, plan, report = tmp_path / "report_tools.py", tmp_path / "report.json", tmp_path / "r"
    tools.write_text(TOOLS)
    plan.write_text(json.dumps(PLAN))
    args = ("run", str(plan), "--tools", str(tools), "--input", json.dumps({"path": str(report)}),
            "--idempotency-key", "report-1", "--replay-verification", "human",
            "--db", store_url)  # fmt: skip
    waiting = cli(*args)
    assert waiting.returncode == 4, waiting.stderr
    job_id = json_of(cli(*args, "--json"))["job_id"]
    assert (
        f"next: affidavit signal {job_id} --key {job_id}:ok "
        """--payload '{"approved": true|false}' --as NAME   (approval of node ok)"""
    ) in waiting.stderr.splitlines()
    waited = cli("jobs", "wait", job_id, "--db", store_url)
    assert waited.returncode == 4 and f"next: affidavit signal {job_id}" in waited.stderr

    signalled = cli("signal", job_id, "--key", f"{job_id}:ok", "--payload", '{"approved": true}',
                    "--as", "ann", "--db", store_url)  # fmt: skip
    assert signalled.returncode == 0, signalled.stderr
    assert f"next: affidavit signal {job_id}" not in signalled.stderr  # (decided: none asked)
    assert "until a worker claims it" in signalled.stderr  # what runs next: a worker
    report.write_text("edited by hand\n")  # the world changed: confirmation parks the job
    parked = cli(*args)
    assert parked.returncode == 4, parked.stderr
    shown = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert shown["status"] == "parked"
    line = (
        f"next: affidavit resume {job_id} --park {shown['parked']['version']} "
        "--decision continue|fail"
    )
    assert line in parked.stderr.splitlines(), parked.stderr
    assert "{'" not in parked.stderr and "{'" not in parked.stdout  # no Python repr
    refused = cli("resume", job_id, "--decision", "retry", "--db", store_url)
    assert refused.returncode == 3


def test_an_output_of_megabytes_is_cut_in_human_output_and_whole_in_json(
    store_url: str, tmp_path: Path
) -> None:
    tools, plan, data = tmp_path / "echo_tools.py", tmp_path / "echo.json", tmp_path / "in.json"
    tools.write_text(ECHO_TOOLS)
    plan.write_text(json.dumps(ECHO_PLAN))
    value = ["x" * 100] * 120_000  # 12 MB
    data.write_text(json.dumps({"v": value}))
    args = ("run", str(plan), "--tools", str(tools), "--input", f"@{data}",
            "--idempotency-key", "big", "--db", store_url)  # fmt: skip
    human = cli(*args)
    assert human.returncode == 0, human.stderr
    assert len(human.stdout) < 11_000
    length = len(json.dumps({"e": {"v": value}}, ensure_ascii=False))
    job_id = json_of(cli(*args, "--json"))["job_id"]
    assert (
        f"(output cut at 10,000 of {length:,} characters; "
        f"`affidavit jobs show {job_id} --json` prints it whole)"
    ) in human.stderr
    whole = cli(*args, "--json")
    assert json_of(whole)["output"] == {"e": {"v": value}}
    shown = cli("jobs", "show", job_id, "--db", store_url)
    assert shown.returncode == 0 and len(shown.stdout) < 50_000
    assert f"(output cut at 10,000 of {length:,} characters" in shown.stderr
