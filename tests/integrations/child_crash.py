"""A worker killed at a crash point while a parent job and its child run, then the job finished
by fresh workers: the crash tests of the integrations' sub-agents share this."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integrations.test_pydantic_ai import cli, run_until_done, submit, worker


def killed_then_finished(
    store_url: str, tools: Path, job_input: Any, env: dict[str, str], agent: str, point: str
) -> str:
    """Submit ``agent``'s job, run a worker killed at ``point``, then run workers until the job
    completes (the child's worker may end before the parent is woken); the job id."""
    root = submit(store_url, tools, job_input, env, agent)
    killed = cli("worker", "--tools", str(tools), "--until-idle", "--lease-seconds", "1",
                 "--db", store_url, env={**env, "AFFIDAVIT_CRASH_AT": point})  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    shown = run_until_done(store_url, root, env, tools=tools)
    for _ in range(5):
        if shown["status"] != "waiting":
            break
        assert worker(store_url, env, tools).returncode == 0
        shown = run_until_done(store_url, root, env, tools=tools)
    assert shown["status"] == "completed", shown
    return root


def tree_verifies(store_url: str, root: str, jobs: int) -> None:
    """``affidavit verify ROOT --tree`` passes over ``jobs`` jobs."""
    verified = cli("verify", root, "--tree", "--db", store_url, "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    doc = json.loads(verified.stdout)
    assert doc["ok"] is True and len(doc["jobs"]) == jobs, doc
