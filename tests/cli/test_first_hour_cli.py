"""What a new user's first commands tell them, as real commands on both backends: `signal` and
`resume` say that a worker must claim the job now and how; an agent's approval is named by its
key; `serve` without --tools says how agent jobs get their code; `submit --namespace`; `jobs
list` shows each job's input; `disclose --step 3` is an agent job's step #3 and `--event N` an
event's version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from affidavit.store import open_store
from tests.cli.test_cli import cli, json_of
from tests.cli.test_hitl_cli import files  # noqa: F401 (a fixture)
from tests.cli.test_serve_cli import free_port
from tests.verify.agent_log import AgentLog, refund_agent_log, store_log

WORKER_LINE = "next: the job is pending until a worker claims it — run one with `affidavit worker"


def test_signal_and_resume_say_a_worker_must_claim_the_job(
    store_url: str,
    files: tuple[Path, Path, Path],  # noqa: F811
) -> None:
    tools, plan, report = files
    ran = cli("run", str(plan), "--tools", str(tools), "--input", json.dumps({"path": str(report)}),
              "--replay-verification", "human", "--db", store_url, "--json")  # fmt: skip
    assert ran.returncode == 4, ran.stderr
    job_id = json_of(ran)["job_id"]
    signalled = cli("signal", job_id, "--key", f"{job_id}:ok", "--payload", '{"approved": true}',
                    "--as", "ann", "--db", store_url)  # fmt: skip
    assert signalled.returncode == 0, signalled.stderr
    assert f"{WORKER_LINE} --tools MODULE`" in signalled.stderr, signalled.stderr
    assert f"`affidavit jobs wait {job_id}`" in signalled.stderr
    shown = cli("jobs", "show", job_id, "--db", store_url)
    assert shown.stdout.splitlines()[-1].startswith(WORKER_LINE), shown.stdout

    report.write_text("edited by hand\n")  # (the world changed: the next run parks)
    assert cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url).returncode == 0
    resumed = cli("resume", job_id, "--decision", "continue", "--db", store_url)
    assert resumed.returncode == 0, resumed.stderr
    assert WORKER_LINE in resumed.stderr, resumed.stderr
    as_json = cli("resume", job_id, "--decision", "continue", "--db", store_url, "--json")
    assert WORKER_LINE not in as_json.stderr + as_json.stdout  # (--json: one document only)


def test_an_agent_approval_is_named_by_its_key(store_url: str) -> None:
    log = AgentLog().start()
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 150})
    log.wait("approval", "big_refund", None, answered=False)
    store = open_store(store_url)
    try:
        job_id = store_log(store, log, status="waiting")
    finally:
        store.close()
    shown = cli("jobs", "show", job_id, "--db", store_url)
    assert shown.stdout.splitlines()[-1].endswith("(approval big_refund (step #1))"), shown.stdout


def test_serve_without_tools_says_how_agent_jobs_get_their_code(store_url: str) -> None:
    assert cli("db", "migrate", "--db", store_url).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "serve", "--port", str(free_port()), "--db", store_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        said = []
        for line in proc.stderr:  # (the banner lines come before the server serves)
            said.append(line)
            if line.startswith("no --tools"):
                break
        text = "".join(said)
        assert '{"agent": NAME' in text and "affidavit worker --tools MODULE" in text, text
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _echo(tmp_path: Path) -> tuple[Path, Path]:
    """A tools module with the pure tool ``echo`` and a one-node plan that calls it."""
    tools = tmp_path / "ns_tools.py"
    tools.write_text("from affidavit import pure\n\n@pure('echo')\ndef echo(ctx, x):\n"
                     "    return {'x': x}\n")  # fmt: skip
    plan = tmp_path / "echo.json"
    plan.write_text(json.dumps({"name": "echo", "nodes": [
        {"id": "e", "type": "pure", "tool": "echo", "args": {"x": "${input.x}"}}]}))  # fmt: skip
    return tools, plan


def test_submit_into_a_namespace_and_list_with_the_input(store_url: str, tmp_path: Path) -> None:
    tools, plan = _echo(tmp_path)
    long_text = "\x9b2J" + "y" * 500  # (a C1 control first: never sent to the terminal)
    made = cli("submit", str(plan), "--tools", str(tools), "--namespace", "team-a",
               "--input", json.dumps({"x": long_text}), "--db", store_url, "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json_of(made)["namespace"] == "team-a"
    job_id = json_of(made)["job_id"]
    listed = json_of(cli("jobs", "list", "--namespace", "team-a", "--db", store_url, "--json"))
    assert [j["job_id"] for j in listed] == [job_id]

    human = cli("jobs", "list", "--db", store_url, env={"COLUMNS": "400"})
    assert human.returncode == 0, human.stderr
    [row] = [line for line in human.stdout.splitlines() if job_id in line]
    assert '{"x":"?2Jyyy' in row and "…" in row and "\x9b" not in row, row

    bad = cli("submit", str(plan), "--tools", str(tools), "--namespace", "has space",
              "--db", store_url, "--json")  # fmt: skip
    assert bad.returncode == 3 and json_of(bad)["error"]["code"] == "config_error"
    assert len(json_of(cli("jobs", "list", "--db", store_url, "--json"))) == 1  # nothing written


def test_disclose_an_agent_step_by_its_number_and_an_event_by_its_version(
    store_url: str, tmp_path: Path
) -> None:
    store = open_store(store_url)
    try:
        job_id = store_log(store, refund_agent_log())
    finally:
        store.close()

    def disclosed(*args: str) -> dict[str, object]:
        result = cli("disclose", job_id, *args, "--db", store_url)
        assert result.returncode == 0, result.stderr
        doc: dict[str, object] = json.loads(result.stdout)
        return doc

    step = disclosed("--step", "4")  # issue_refund, as `jobs trace` lists it
    assert step["selector"] == "#4"
    events = step["events"]
    assert isinstance(events, list) and {e["payload"]["node_id"] for e in events} == {"#4"}
    assert disclosed("--step", "#4")["events"] == events
    one = disclosed("--event", "1")
    assert one["selector"] == "1" and [e["type"] for e in one["events"]] == ["job_created"]  # type: ignore[attr-defined]

    both = cli("disclose", job_id, "--step", "4", "--event", "1", "--db", store_url, "--json")
    assert both.returncode == 3 and json_of(both)["error"]["code"] == "config_error"
    neither = cli("disclose", job_id, "--db", store_url, "--json")
    assert neither.returncode == 3, neither.stdout

    tools, plan = _echo(tmp_path)
    ran = cli("run", str(plan), "--tools", str(tools), "--input", '{"x": 1}', "--db", store_url,
              "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    plan_job = json_of(ran)["job_id"]
    number = cli("disclose", plan_job, "--step", "1", "--db", store_url, "--json")
    assert number.returncode == 2, number.stdout
    error = json_of(number)["error"]
    assert error["code"] == "step_not_found" and "--event 1" in error["hint"]
    assert cli("disclose", plan_job, "--event", "1", "--db", store_url).returncode == 0
