"""A worker that lacks a job's tools (started without, or with the wrong, ``--tools``) hands
the job back untouched instead of failing it, and does not claim it again; a worker with the
tools then runs it. Both backends."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from affidavit import Runtime, Tool, ToolRegistry
from affidavit.core.errors import PlanError
from tests.cli.test_cli import cli, json_of
from tests.runtime.helpers import node, plan

TOOLS = """
from affidavit import tool

@tool("stamp")
def stamp(ctx):
    return {"stamped": ctx.node_id}
"""


def test_a_worker_without_the_tools_hands_the_job_back(store_url: str, tmp_path: Path) -> None:
    tools = tmp_path / "stamp_tools.py"
    tools.write_text(TOOLS)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan(node("a", "stamp"), node("b", "stamp", deps=["a"]))))
    submitted = cli("submit", str(plan_file), "--tools", str(tools), "--db", store_url, "--json")
    job_id = json_of(submitted)["job_id"]

    bare = cli("worker", "--until-idle", "--db", store_url, "--json")
    assert bare.returncode == 0, bare.stderr
    assert json_of(bare) == {"jobs_run": 0}  # claimed once, handed back, not claimed again
    assert "needs tool 'stamp'" in bare.stderr and job_id in bare.stderr
    shown = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert shown["event_count"] == 2 and shown["status"] == "pending"  # as it was claimed
    assert shown["lease_owner"] is None  # handed back: no worker holds it
    listed = cli("jobs", "list", "--status", "running", "--db", store_url, "--json")
    assert json_of(listed) == []  # not listed as running with nobody running it
    assert isinstance(shown["lease_expires_at"], float)  # JSON: Unix time, as documented
    human = cli("jobs", "show", job_id, "--db", store_url).stdout
    [lease] = [line.split() for line in human.splitlines() if "lease_expires_at" in line]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", lease[1]), lease

    full = cli("worker", "--until-idle", "--tools", str(tools), "--db", store_url, "--json")
    assert full.returncode == 0, full.stderr
    assert json_of(full) == {"jobs_run": 1}  # the lease was given back: no wait for it
    done = json_of(cli("jobs", "show", job_id, "--db", store_url, "--json"))
    assert done["status"] == "completed"
    assert done["output"] == {"b": {"stamped": "b"}}


def test_run_job_names_the_missing_tools(store_url: str) -> None:
    full = ToolRegistry(
        [Tool("stamp", lambda ctx: {}, "tool"), Tool("think", lambda ctx: 1, "pure")]
    )
    graph = plan(node("a", "stamp"), node("b", "think", "pure", deps=["a"]))
    with Runtime(store_url, tools=full) as rt:
        job_id = rt.submit(graph, {}).job_id
    only_stamp = ToolRegistry([Tool("stamp", lambda ctx: {}, "tool")])
    with Runtime(store_url, tools=only_stamp) as rt:
        with pytest.raises(PlanError, match="needs pure 'think'"):
            rt.run_job(job_id)
        assert rt.get_job(job_id).version == 2  # nothing written
    with Runtime(store_url, tools=full) as rt:
        assert rt.run_job(job_id).status == "completed"
