"""``affidavit jobs watch`` as a real process on both backends: a running job's stream values
reach its stdout while the job runs; it ends with the job (or when the job needs someone) with
``run``'s exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from affidavit import Runtime
from tests.api import stream_tools
from tests.cli.test_cli import cli, cli_env
from tests.runtime import agent_tools as at


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    with Runtime(store_url, tools=stream_tools.TOOLS) as runtime:
        yield runtime


def watch(store_url: str, job_id: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "affidavit", "jobs", "watch", job_id, "--db", store_url, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )


def gated(rt: Runtime, fail: bool = False) -> tuple[str, threading.Thread]:
    job_id = rt.submit("gated_agent", {"fail": fail}).job_id
    stream_tools.GATES[job_id] = threading.Event()
    runner = threading.Thread(target=rt.run_job, args=(job_id,), daemon=True)
    runner.start()
    return job_id, runner


def test_watch_json_sees_values_while_the_job_runs(rt: Runtime, store_url: str) -> None:
    job_id, runner = gated(rt)
    proc = watch(store_url, job_id, "--json")
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        doc = json.loads(line)  # JSON lines, each one document
        lines.append(doc)
        if doc.get("type") == "stream_emitted" and doc["payload"]["value"] == {"held": True}:
            assert rt.get_job(job_id).status == "running"  # seen inside the step
            stream_tools.GATES[job_id].set()
    assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    runner.join(30)
    *events, last = lines
    assert [e["version"] for e in events] == list(range(1, len(events) + 1))
    values = [e["payload"]["value"] for e in events if e["type"] == "stream_emitted"]
    assert values == ["first", {"held": True}, "second"]
    assert last["job_id"] == job_id and last["status"] == "completed"


def test_watch_prints_values_and_exits_as_run_does(rt: Runtime, store_url: str) -> None:
    job_id, runner = gated(rt, fail=True)
    proc = watch(store_url, job_id)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert json.loads(first) == "first"  # a value: on stdout, as JSON, before the job moved on
    stream_tools.GATES[job_id].set()
    out = proc.stdout.read()  # (the same buffered reader: not communicate(), which bypasses it)
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(60) == 1  # failed
    runner.join(30)
    assert [json.loads(x) for x in out.splitlines()[:2]] == [{"held": True}, "second"]
    assert "job_created" in err and "failed" in err
    # a finished job: everything after --after-version, then the same exit code
    again = cli("jobs", "watch", job_id, "--db", store_url, "--json", "--after-version", "3")
    docs = [json.loads(x) for x in again.stdout.splitlines()]
    assert again.returncode == 1 and docs[0]["version"] == 4 and docs[-1]["status"] == "failed"


def test_watch_ends_when_the_job_waits_and_after_its_timeout(rt: Runtime, store_url: str) -> None:
    with Runtime(store_url, tools=at.registry()) as other:
        waiting = other.submit("wait_agent", {}).job_id
        assert other.run_job(waiting).status == "waiting"
    done = cli("jobs", "watch", waiting, "--db", store_url, "--json")
    assert done.returncode == 4, done.stderr  # a human is needed
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "waiting"
    job_id, runner = gated(rt)
    proc = watch(store_url, job_id, "--json", "--timeout", "0.5")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 124
    assert json.loads(out.splitlines()[-1])["status"] == "running"
    stream_tools.GATES[job_id].set()
    runner.join(30)
    missing = cli("jobs", "watch", "no-such-job", "--db", store_url)
    assert missing.returncode == 2
