"""Cooperative cancel (docs/runtime.md, "Cancelling a job"): a running tool sees its job's
cancel request as ``ctx.cancelled`` — polled by the run's heartbeat, not per look — and may
stop; the stop is recorded as the failure it is, and the job ends cancelled. A tool that
raises the same error without a request is an ordinary failure. Real worker processes and the
real CLI, both backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from affidavit import Runtime, Tool, ToolCancelled, ToolContext, ToolRegistry
from affidavit.verify import verify_job
from tests.cli.test_cli import cli, cli_env, json_of
from tests.runtime.helpers import assert_log_sound, of_type
from tests.runtime.test_cancel_in_flight import finish, verify_cli, wait_for
from tests.runtime.timeout_tools import REGISTRY, one_call

TOOLS = str(Path(__file__).with_name("timeout_tools.py"))


def worker(url: str, lease: float) -> subprocess.Popen[str]:
    """``affidavit worker --until-idle`` with the timeout tools, as a real process."""
    return subprocess.Popen(
        [sys.executable, "-m", "affidavit", "worker", "--tools", TOOLS, "--until-idle",
         "--lease-seconds", str(lease), "--db", url, "--json"],
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.parametrize("shape", ["plan", "agent"])
def test_a_tool_loop_stops_on_cancel_and_the_job_ends_cancelled(
    store_url: str, tmp_path: Path, shape: str
) -> None:
    with Runtime(store_url, tools=REGISTRY) as rt:
        if shape == "agent":
            job_id = rt.submit("to_loop_agent", {"dir": str(tmp_path)}).job_id
        else:
            job_id = rt.submit(one_call("to_loop", tmp_path, None), {}).job_id
        proc = worker(store_url, lease=1.5)  # a heartbeat every 0.5 s
        try:
            wait_for("the call", (tmp_path / "started").exists, proc)
            r = cli("cancel", job_id, "--reason", "enough", "--db", store_url, "--json")
            assert r.returncode == 0, r.stderr
            assert json_of(r)["cancel"]["state"] == "requested"
            finish(proc)  # the loop stopped (it would run 60 s): the worker went idle
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert (tmp_path / "stopped").exists()
        job = rt.get_job(job_id)
        assert job.status == "cancelled"
        events = assert_log_sound(rt.store, job_id)
        [finished] = of_type(events, "tool_invocation_finished")
        assert finished["outcome"] == "failure"  # its real outcome: it stopped, of its own
        assert finished["error"]["type"] == "ToolCancelled"
        [node] = of_type(events, "node_finished")
        assert node["result_type"] == "permanent_failure"
        assert of_type(events, "job_cancelled")[0]["reason"] == "enough"
        assert not of_type(events, "job_failed")
        assert verify_job(rt.store, job_id).ok
    assert verify_cli(store_url, job_id)["ok"] is True


def test_a_forced_cancel_reaches_the_tool_and_keeps_the_call_unknown(
    store_url: str, tmp_path: Path
) -> None:
    """``--force`` closes the call in flight as ``unknown`` at once; the tool still learns
    of it (its worker's next heartbeat) and stops; what it records after is fenced off."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_id = rt.submit(one_call("to_loop", tmp_path, None), {}).job_id
        proc = worker(store_url, lease=1.5)
        try:
            wait_for("the call", (tmp_path / "started").exists, proc)
            r = cli("cancel", job_id, "--force", "--db", store_url, "--json")
            assert r.returncode == 0, r.stderr
            assert json_of(r)["cancel"]["state"] == "cancelled"
            wait_for("the tool to stop", (tmp_path / "stopped").exists, proc)
            finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert rt.get_job(job_id).status == "cancelled"
        events = assert_log_sound(rt.store, job_id)
        [finished] = of_type(events, "tool_invocation_finished")
        assert finished["outcome"] == "unknown"
        assert verify_job(rt.store, job_id).ok


def test_check_cancelled_without_a_request_is_an_ordinary_failure(
    store_url: str, tmp_path: Path
) -> None:
    """A tool that raises ToolCancelled itself, no cancel asked: the job fails, it is not
    recorded as cancelled (the record does not take the tool's word for a request)."""

    def liar(ctx: ToolContext) -> None:
        assert not ctx.cancelled
        ctx.check_cancelled()  # (nothing asked: returns)
        raise ToolCancelled("not asked")

    with Runtime(store_url, tools=ToolRegistry([Tool("liar", liar, "tool")])) as rt:
        plan = {"name": "liar", "nodes": [{"id": "l", "type": "tool", "tool": "liar"}]}
        job_id = rt.submit(plan, {}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "failed"
        assert verify_job(rt.store, job_id).ok


@pytest.mark.parametrize("how", ["sleep", "wait"])
def test_a_cancel_ends_a_sleeping_or_waiting_agent_job(
    store_url: str, tmp_path: Path, how: str
) -> None:
    """No worker holds a sleeping or waiting job: the cancel ends it at once, and its timer
    never wakes it (nothing runs after)."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_id = rt.submit("to_sleeper", {"dir": str(tmp_path), "how": how}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "waiting"
        assert rt.cancel(job_id, reason="not needed").status == "cancelled"
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "cancelled"
        assert not (tmp_path / "effects.jsonl").exists()
        events = assert_log_sound(rt.store, job_id)
        assert not of_type(events, "wait_completed")
        assert verify_job(rt.store, job_id).ok
