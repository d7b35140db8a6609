"""Agent versions, on both backends, with workers that each load the code anew (the agent is
submitted from a process of its own): an agent without ``version=`` is not pinned, so a worker
running edited code continues a job whose recorded calls the new code reproduces (each step
records which source called it), and the nondeterminism check parks one it does not; a pinned
version still refuses other workers."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import affidavit
from affidavit import AgentContext, PlanError, Runtime, ToolRegistry
from affidavit.core.agent_steps import agent_hash
from affidavit.runtime._agent import Agent, source_sha256
from tests.cli.test_cli import cli as any_cli
from tests.runtime.helpers import assert_log_sound, of_type

SRC = str(Path(affidavit.__file__).resolve().parents[1])

MODULE = """\
import affidavit


@affidavit.pure("ver_double", version="1")
def double(ctx: affidavit.ToolContext, n: int) -> int:
    return n * 2


@affidavit.agent("ver_agent"PIN)
def ver_agent(ctx: affidavit.AgentContext, n: int) -> dict:
    a = ctx.call(double, n=n)
    ctx.wait("go")
    b = ctx.call(double, n=a)
    return {"b": b}
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """tests/cli/test_cli.py's ``cli``: a worker runs in this process with the tools file's
    module imported anew (as in a new process) and forgotten afterwards."""
    return any_cli(*args)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def submit(url: str, tools: Path) -> str:
    """Submit ``ver_agent`` from a process that loads ``tools`` (the submitting code)."""
    code = (
        "import sys\n"
        "from affidavit import Runtime, load_tools\n"
        "load_tools(sys.argv[1])\n"
        "with Runtime(sys.argv[2]) as rt:\n"
        "    print(rt.submit('ver_agent', {'n': 3}).job_id)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tools), url],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def work(url: str, tools: Path) -> subprocess.CompletedProcess[str]:
    ran = cli("worker", "--tools", str(tools), "--until-idle", "--db", url)
    assert ran.returncode == 0, ran.stderr
    return ran


def started_then_continued(
    url: str, tmp_path: Path, old: str, new: str
) -> tuple[str, Path, subprocess.CompletedProcess[str]]:
    """A job started by ``old`` code (it waits for ``go``), signalled, then run by a new worker
    loading ``new`` code from another file (its job id, that file, that worker)."""
    before = write(tmp_path / "before" / "ver_tools.py", old)
    after = write(tmp_path / "after" / "ver_tools.py", new)
    job_id = submit(url, before)
    work(url, before)
    shown = json.loads(cli("jobs", "show", job_id, "--db", url, "--json").stdout)
    assert shown["status"] == "waiting", shown
    signalled = cli("signal", job_id, "--key", "go", "--payload", "{}", "--db", url)
    assert signalled.returncode == 0, signalled.stderr
    return job_id, after, work(url, after)


def code_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


UNPINNED = MODULE.replace("PIN", "")
COMMENTED = UNPINNED.replace(
    "    a = ctx.call", "    # the first call doubles the input\n    a = ctx.call"
)
REWRITTEN = UNPINNED.replace(
    '    b = ctx.call(double, n=a)\n    return {"b": b}',
    '    b = ctx.call("ver_double", n=int(a))\n    stamp = ctx.now()\n'
    '    return {"b": b, "stamped": stamp > 0}',
)
DIVERGED = UNPINNED.replace("a = ctx.call(double, n=n)", "a = ctx.call(double, n=n + 1)")


@pytest.mark.parametrize(
    ("new", "output"),
    [(COMMENTED, {"b": 12}), (REWRITTEN, {"b": 12, "stamped": True})],
    ids=["comment", "reproducing_change"],
)
def test_edited_code_that_reproduces_the_calls_continues_the_job(
    store_url: str, tmp_path: Path, new: str, output: dict[str, Any]
) -> None:
    assert new != UNPINNED
    job_id, after, _ = started_then_continued(store_url, tmp_path, UNPINNED, new)
    with Runtime(store_url) as rt:
        job = rt.get_job(job_id)
        assert job.status == "completed", job
        assert job.output == output
        events = assert_log_sound(rt.store, job_id)
    [started] = of_type(events, "agent_started")
    assert started["agent_version"] is None
    assert started["agent_hash"] == agent_hash("ver_agent", None)
    before = tmp_path / "before" / "ver_tools.py"
    assert started["code_sha256"] == code_hash(before)
    called = of_type(events, "step_called")
    # the first call and the wait were called by the old code, the steps after it by the new
    old, new = code_hash(before), code_hash(after)
    assert [c["code_sha256"] for c in called] == [old, old] + [new] * (len(called) - 2)
    verified = cli("verify", job_id, "--db", store_url)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    trace = json.loads(cli("jobs", "trace", job_id, "--db", store_url, "--json").stdout)
    assert trace["agent"]["version"] is None
    assert trace["agent"]["code_sha256"] == code_hash(before)
    assert trace["nodes"][-1]["code_sha256"] == code_hash(after)


def test_edited_code_that_diverges_parks_nondeterministic(store_url: str, tmp_path: Path) -> None:
    job_id, _, _ = started_then_continued(store_url, tmp_path, UNPINNED, DIVERGED)
    with Runtime(store_url) as rt:
        assert rt.get_job(job_id).status == "parked"
        events = assert_log_sound(rt.store, job_id)
    [parked] = of_type(events, "job_parked")
    assert parked["reason"] == "nondeterministic" and parked["node_id"] == "#0"
    assert len(of_type(events, "step_called")) == 2  # the diverging code called nothing new
    verified = cli("verify", job_id, "--db", store_url)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize(
    ("old_pin", "new_pin"),
    [(', version="1"', ', version="2"'), (', version="1"', ""), ("", ', version="1"')],
    ids=["pinned_to_other", "pinned_to_unpinned", "unpinned_to_pinned"],
)
def test_a_pinned_version_on_either_side_must_match(
    store_url: str, tmp_path: Path, old_pin: str, new_pin: str
) -> None:
    old, new = MODULE.replace("PIN", old_pin), MODULE.replace("PIN", new_pin)
    job_id, _, refused = started_then_continued(store_url, tmp_path, old, new)
    assert "unrunnable" in refused.stderr and "version" in refused.stderr, refused.stderr
    with Runtime(store_url) as rt:
        job = rt.get_job(job_id)
        events = rt.store.list_events(job_id)
    assert job.lease_owner is None and job.status != "completed", job  # handed back
    assert events[-1].type == "wait_completed"  # nothing written after the signal
    work(store_url, tmp_path / "before" / "ver_tools.py")  # the old code still finishes it
    with Runtime(store_url) as rt:
        assert rt.get_job(job_id).status == "completed"


def test_a_log_of_an_earlier_release_runs_on_the_same_source_only(store_url: str) -> None:
    """Before, the default version was the first 16 hex of the source's hash: such a job
    still runs on an unpinned agent of that source, and is refused by another source."""

    def fn(ctx: AgentContext) -> Any:
        return ctx.now() > 0

    here = source_sha256(fn)
    assert here is not None
    legacy = Agent("legacy", fn, here[:16], code_sha256=here)
    with Runtime(store_url, tools=ToolRegistry([legacy])) as rt:
        job_id = rt.submit(legacy, {}).job_id
        edited = Agent("legacy", fn, None, code_sha256="0" * 64)
        other = Runtime(store_url, tools=ToolRegistry([edited]))
        with other, pytest.raises(PlanError, match=r"version '[0-9a-f]{16}'.*version unpinned"):
            other.run_job(job_id)
    same = Agent("legacy", fn, None, code_sha256=here)
    with Runtime(store_url, tools=ToolRegistry([same])) as rt:
        assert rt.run_job(job_id).status == "completed"
        assert_log_sound(rt.store, job_id)
