"""``cli`` runs most commands in the test's own process (tests/cli/test_cli.py): each of those
answers there exactly as in a process of its own — exit code, stdout and stderr — for a
command that succeeds and for one that is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_cli import _in_process, cli, cli_env, cli_process, seeded

JOB = "{job}"  # (replaced by the seeded job's id)

COMMANDS = [
    ["jobs", "show", JOB, "--json"],
    ["jobs", "show", JOB],
    ["jobs", "events", JOB, "--json"],
    ["jobs", "list", "--status", "sleeping", "--json"],
    ["jobs", "fork", "no-such-job", "--json"],
    ["verify", JOB, "--json"],
    ["queues", "list", "--json"],
    ["queues", "show", "no-such-queue", "--json"],
    ["limits", "list", "--json"],
    ["schedules", "list", "--json"],
    ["schedules", "pause", "no-such-schedule", "--json"],
    ["claims", "verify", "--agent", "nobody", "--type", "custom", "--claim", "{", "--json"],
    ["claims", "history", "nobody", "--json"],
    ["log", "verify", "--json"],
    ["trust", "show", "nobody"],
    ["worker", "--until-idle", "--max-outage-seconds", "-1", "--json"],
    ["run", "no-such-plan.json", "--json"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_command_answers_in_this_process_as_in_its_own(
    store_url: str, command: list[str]
) -> None:
    job_id = seeded(store_url)
    args = [job_id if a == JOB else a for a in command] + ["--db", store_url]
    assert _in_process(tuple(args), cli_env())
    here = cli(*args)
    there = cli_process(*args)
    assert (here.returncode, here.stdout, here.stderr) == (
        there.returncode,
        there.stdout,
        there.stderr,
    )


def test_rce_verify_of_a_directory_that_is_no_pack(tmp_path: Path) -> None:
    args = ("rce-verify", str(tmp_path / "missing"), "--json")
    assert _in_process(args, cli_env())
    here, there = cli(*args), cli_process(*args)
    assert here.returncode == there.returncode != 0
    assert (here.stdout, here.stderr) == (there.stdout, there.stderr)


def test_a_worker_that_polls_supervises_serves_or_is_traced_runs_in_its_own_process() -> None:
    env = cli_env()
    assert _in_process(("worker", "--until-idle", "--json"), env)
    assert _in_process(("run", "plan.json"), env)
    assert not _in_process(("worker",), env)  # (polls until stopped)
    assert not _in_process(("worker", "--until-idle", "--processes", "2"), env)
    assert not _in_process(("worker", "--until-idle", "--metrics-port", "9100"), env)
    assert not _in_process(("run", "plan.json"), {**env, "OTEL_TRACES_EXPORTER": "console"})
    assert not _in_process(
        ("run", "plan.json"), {**env, "AFFIDAVIT_CRASH_AT": "tool.after_execute"}
    )
