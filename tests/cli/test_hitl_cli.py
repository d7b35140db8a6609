"""``affidavit signal``, ``resume --decision continue`` and ``--replay-verification`` through
``cli`` (tests/cli/test_cli.py), on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import cli, json_of

TOOLS = """
from pathlib import Path
from affidavit import pure, register_verifier, tool
from affidavit.runtime._verifiers import FileVerifier, record_file

register_verifier(FileVerifier())

@tool("write_report")
def write_report(ctx, path):
    Path(path).write_text("refund approved\\n")
    record_file(ctx, path)
    return {"path": path}

@pure("summarize")
def summarize(ctx, report, approval):
    return {"report": report["path"], "approved": approval}
"""

PLAN = {
    "name": "report",
    "nodes": [
        {"id": "write", "type": "tool", "tool": "write_report", "args": {"path": "${input.path}"}},
        {"id": "ok", "type": "approval", "depends_on": ["write"]},
        {
            "id": "sum",
            "type": "pure",
            "tool": "summarize",
            "args": {"report": "${write}", "approval": "${ok}"},
            "depends_on": ["ok"],
        },
    ],
}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    tools = tmp_path / "report_tools.py"
    tools.write_text(TOOLS)
    plan = tmp_path / "report.json"
    plan.write_text(json.dumps(PLAN))
    return tools, plan, tmp_path / "report.txt"


def events_count(store_url: str, job_id: str) -> int:
    return int(json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))["event_count"])


def test_signal_a_waiting_job(store_url: str, files: tuple[Path, Path, Path]) -> None:
    tools, plan, report = files
    ran = cli("run", str(plan), "--tools", str(tools), "--input", json.dumps({"path": str(report)}),
              "--db", store_url, "--json")  # fmt: skip
    assert ran.returncode == 4, ran.stderr  # waiting: a human is needed
    job_id = json_of(ran)["job_id"]
    shown = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert shown["status"] == "waiting"
    assert shown["waiting_for"] == [
        {"node_id": "ok", "wait_type": "approval", "correlation_key": f"{job_id}:ok"}
    ]
    human = cli("jobs", "show", job_id, "--db", store_url)
    assert human.returncode == 0
    assert human.stdout.splitlines()[-1] == (
        f"next: affidavit signal {job_id} --key {job_id}:ok "
        """--payload '{"approved": true|false}' --as NAME   (approval of node ok)"""
    )
    before = events_count(store_url, job_id)

    wrong = cli("signal", job_id, "--key", "nope", "--db", store_url, "--json")
    assert wrong.returncode == 1
    assert json_of(wrong)["error"]["code"] == "signal_rejected"
    bad = cli("signal", job_id, "--key", f"{job_id}:ok", "--payload", "{nope", "--db", store_url)
    assert bad.returncode == 3 and "not valid JSON" in bad.stderr
    missing = cli("signal", "no-such-job", "--key", "k", "--db", store_url)
    assert missing.returncode == 2
    looks_denied = cli("signal", job_id, "--key", f"{job_id}:ok", "--payload", '{"approved": "no"}',
                       "--as", "ann", "--db", store_url, "--json")  # fmt: skip
    assert looks_denied.returncode == 3
    assert json_of(looks_denied)["error"]["code"] == "signal_payload_invalid"
    key = f"{job_id}:ok"
    # an empty signal decides nothing, whoever sends it
    empty = cli("signal", job_id, "--key", key, "--as", "ann", "--db", store_url, "--json")
    assert empty.returncode == 3, empty.stderr
    error = json_of(empty)["error"]
    assert error["code"] == "signal_payload_invalid" and '{"approved": true}' in error["hint"]
    payload = json.dumps({"approved": True, "comment": "checked"})
    # the CLI decides as a named operator only
    anonymous = cli("signal", job_id, "--key", key, "--payload", payload, "--db", store_url,
                    "--json")  # fmt: skip
    assert anonymous.returncode == 1
    assert json_of(anonymous)["error"]["code"] == "approval_forbidden"
    assert "--as NAME" in json_of(anonymous)["error"]["hint"]
    assert events_count(store_url, job_id) == before  # refusals wrote nothing

    signal = ("signal", job_id, "--key", key, "--payload", payload, "--as", "ann")
    first = cli(*signal, "--db", store_url, "--json")
    assert first.returncode == 0, first.stderr
    assert json_of(first) | {"job_id": job_id} == {
        "job_id": job_id, "status": "pending", "output": None, "error": None, "appended": True,
    }  # fmt: skip
    again = cli(*signal, "--db", store_url, "--json")
    assert again.returncode == 0 and json_of(again)["appended"] is False
    assert events_count(store_url, job_id) == before + 1

    worker = cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url, "--json")
    assert worker.returncode == 0 and json_of(worker) == {"jobs_run": 1}
    done = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert done["status"] == "completed"
    assert done["output"] == {
        "sum": {"report": str(report), "approved": {"approved": True, "comment": "checked"}}
    }
    events = json_of(cli("jobs", "events", job_id, "--db", store_url, "--json"))
    [decided] = [e["payload"] for e in events if e["type"] == "wait_completed"]
    assert decided["signalled_by"] == "operator:ann"
    assert [(d["principal"], d["role"]) for d in decided["decided_by"]] == [
        ("operator:ann", "admin")
    ]


def test_changed_world_parks_and_a_person_continues(
    store_url: str, files: tuple[Path, Path, Path]
) -> None:
    tools, plan, report = files
    ran = cli("run", str(plan), "--tools", str(tools), "--input", json.dumps({"path": str(report)}),
              "--replay-verification", "human", "--db", store_url, "--json")  # fmt: skip
    assert ran.returncode == 4
    job_id = json_of(ran)["job_id"]
    approve = ("--payload", '{"approved": true}', "--as", "ann")
    assert (
        cli("signal", job_id, "--key", f"{job_id}:ok", *approve, "--db", store_url).returncode == 0
    )
    report.write_text("refund approved, then edited by hand\n")
    worker = cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url)
    assert worker.returncode == 0, worker.stderr
    shown = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert shown["status"] == "parked"
    assert shown["parked"]["reason"] == "replay_verification"
    assert shown["parked"]["node_id"] == "write"
    assert "changed since the step wrote it" in shown["parked"]["detail"]["mismatches"][0]["reason"]
    human = cli("jobs", "show", job_id, "--db", store_url)
    assert human.stdout.splitlines()[-1] == (
        f"next: affidavit resume {job_id} --park {shown['parked']['version']} "
        "--decision continue|fail"
    )

    refused = cli("resume", job_id, "--decision", "retry", "--db", store_url, "--json")
    assert refused.returncode == 3
    assert "continue" in json_of(refused)["error"]["hint"]
    resumed = cli("resume", job_id, "--decision", "continue", "--note", "edit was mine",
                  "--db", store_url, "--json")  # fmt: skip
    assert resumed.returncode == 0 and json_of(resumed)["status"] == "pending"
    assert cli("worker", "--tools", str(tools), "--until-idle", "--db", store_url).returncode == 0
    assert json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))["status"] == (
        "completed"
    )


def test_bad_replay_verification_mode_is_a_usage_error(
    store_url: str, files: tuple[Path, Path, Path]
) -> None:
    tools, plan, _ = files
    bad = cli("submit", str(plan), "--tools", str(tools), "--replay-verification", "lenient",
              "--db", store_url)  # fmt: skip
    assert bad.returncode == 3  # a usage error, before anything is written
    listed = cli("jobs", "list", "--db", store_url, "--json")
    assert listed.returncode in (0, 3)
    if listed.returncode == 0:
        assert json_of(listed) == []


def test_the_operator_may_not_approve_a_job_it_submitted(store_url: str) -> None:
    """The CLI's operator is operator:NAME: a job submitted as that principal is not its to
    approve (the record would say one person both asked and approved)."""
    from affidavit import Runtime

    with Runtime(store_url) as rt:
        job_id = rt.submit(
            {"nodes": [{"id": "ok", "type": "approval"}]}, {}, submitted_by="operator:ann"
        ).job_id
        assert rt.run_job(job_id).status == "waiting"
    before = events_count(store_url, job_id)
    mine = cli("signal", job_id, "--key", f"{job_id}:ok", "--payload", '{"approved": true}',
               "--as", "ann", "--db", store_url, "--json")  # fmt: skip
    assert mine.returncode == 1
    assert "submitted the job" in json_of(mine)["error"]["message"]
    assert events_count(store_url, job_id) == before
    other = cli("signal", job_id, "--key", f"{job_id}:ok", "--payload", '{"approved": true}',
                "--as", "bo", "--db", store_url, "--json")  # fmt: skip
    assert other.returncode == 0, other.stderr
