"""``affidavit mcp``'s job tools (list_jobs, get_job, submit_job, signal, approve), its tools'
schemas and hints, its argument errors, its role table (held to docs/integrations.md) and its
options — a real subprocess driven by the MCP SDK's own client, on both backends."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio
import pytest

from affidavit import Runtime, ToolRegistry
from affidavit.mcp.server import ROLES
from affidavit.store import JobFilter, open_store
from affidavit.store.queues import claim_from_queue, queue_config, set_queue
from tests.integrations.test_mcp_server import (
    TOOL_NAMES,
    TOOLS,
    TRANSPORTS,
    World,
    call,
    connect,
    world,
)

__all__ = ["world"]  # (the module's fixture, shared)

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs" / "integrations.md"
APPROVAL_PLAN = {
    "name": "mcp-approval",
    "nodes": [
        {"id": "ok", "type": "approval"},
        {"id": "a", "type": "tool", "tool": "mcp_srv_act", "args": {"x": 1}, "depends_on": ["ok"]},
    ],
}
WAIT_PLAN = {"name": "mcp-wait", "nodes": [{"id": "w", "type": "wait"}]}
# a key of the role just below each tool's
BELOW = {"agent": "observer_a", "approver": "agent_a", "admin": "agent_a"}


def error_of(world: World, transport: str, key: str, tool: str, /, **args: Any) -> dict[str, Any]:
    """The ``{"code", "message", "hint"}`` of a call that must fail."""

    async def go() -> dict[str, Any]:
        async with connect(world, transport, key) as client:
            result = await client.call_tool(tool, args)
        assert result.is_error, result
        text = result.content[0].text  # type: ignore[union-attr]
        prefix = f"Error executing tool {tool}: "
        assert text.startswith(prefix), text
        error: dict[str, Any] = json.loads(text[len(prefix) :])["error"]
        assert set(error) == {"code", "message", "hint"}
        return error

    return anyio.run(go)


def _run(world: World, job_id: str) -> str:
    with Runtime(world.db_url, tools=TOOLS, signing_key=world.key_file) as rt:
        return rt.run_job(job_id).status


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tools_have_schemas_hints_and_the_package_version(world: World, transport: str) -> None:
    async def go() -> Any:
        async with connect(world, transport, "observer_a") as client:
            return client.server_info, (await client.list_tools()).tools

    info, tools = anyio.run(go)
    assert info is not None and info.version == metadata.version("affidavit")
    assert {t.name for t in tools} == TOOL_NAMES == set(ROLES)
    for tool in tools:
        schema = tool.output_schema
        assert schema is not None and schema["type"] == "object", tool.name
        assert len(schema["properties"]) >= 3 and schema["required"], tool.name
        hints = tool.annotations
        assert hints is not None, tool.name
        assert hints.read_only_hint is not None and hints.idempotent_hint is not None
        assert hints.destructive_hint is not None
    by_name = {t.name: t.annotations for t in tools}
    for name in ("verify_job", "get_job", "list_jobs", "get_trust", "verify_pack"):
        assert by_name[name].read_only_hint is True  # type: ignore[union-attr]
    for name in ("submit_job", "signal", "approve", "verify_claim"):
        assert by_name[name].read_only_hint is False  # type: ignore[union-attr]
    assert by_name["approve"].destructive_hint is True  # type: ignore[union-attr]
    assert by_name["verify_claim"].idempotent_hint is False  # type: ignore[union-attr]


def _documented_roles() -> dict[str, str]:
    text = DOCS.read_text()
    table = text[text.index("| tool | arguments | role | answer |") :].split("\n\n")[0]
    rows = [r for r in table.splitlines()[2:] if r.startswith("| `")]
    roles = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        roles[cells[0].strip("`")] = cells[2]
    return roles


def test_the_documented_role_table_is_the_servers(world: World) -> None:
    assert _documented_roles() == ROLES
    assert ROLES["verify_claim"] == "admin"
    # and the server enforces it: a key of the role just below each tool's is refused
    args: dict[str, dict[str, Any]] = {
        "submit_job": {"plan": WAIT_PLAN},
        "signal": {"job_id": world.job_a, "key": "k"},
        "approve": {"job_id": world.job_a, "key": "k", "approved": True},
        "verify_claim": {
            "agent_id": "worker-a",
            "claim_type": "custom",
            "claim": {"return_code": 0},
            "command": "true",
        },
    }
    for tool, role in ROLES.items():
        if role == "observer":
            continue
        refused = error_of(world, "http", BELOW[role], tool, **args[tool])
        assert refused["code"] == "forbidden", (tool, refused)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("tool", "args", "where"),
    [
        ("verify_job", {"job_id": ""}, "job_id"),
        ("verify_job", {}, "job_id"),
        ("get_job", {"job_id": 7}, "job_id"),
        ("list_jobs", {"limit": 0}, "limit"),
        ("list_jobs", {"status": ["nope"]}, "status"),
        ("approve", {"job_id": "j", "key": "k", "approved": "maybe"}, "approved"),
    ],
)
def test_argument_errors_are_documents(
    world: World, transport: str, tool: str, args: dict[str, Any], where: str
) -> None:
    error = error_of(world, transport, "admin", tool, **args)
    assert error["code"] == "invalid_input"
    assert error["message"].startswith("invalid arguments: ") and where in error["message"]
    assert tool in error["hint"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_list_and_get_jobs_stay_in_the_namespace(world: World, transport: str) -> None:
    page = call(world, transport, "observer_a", "list_jobs")
    ids = {j["job_id"] for j in page["jobs"]}
    assert world.job_a in ids and world.job_b not in ids
    assert {j["namespace"] for j in page["jobs"]} == {"a"}
    one = call(world, transport, "observer_a", "list_jobs", limit=1)
    assert len(one["jobs"]) == 1 and one["next_before"] == one["jobs"][0]["job_id"]
    assert call(world, transport, "observer_a", "list_jobs", namespace="b") == (
        "error",
        "forbidden",
    )
    admin = call(world, transport, "admin", "list_jobs", namespace="b")
    assert [j["job_id"] for j in admin["jobs"]] == [world.job_b]
    job = call(world, transport, "observer_a", "get_job", job_id=world.job_a)
    assert job["job_id"] == world.job_a and job["status"] == "completed"
    assert call(world, transport, "agent_b", "get_job", job_id=world.job_a) == (
        "error",
        "job_not_found",
    )


def test_submit_and_signal(world: World) -> None:
    submitted = call(world, "stdio", "agent_a", "submit_job", plan=WAIT_PLAN, idempotency_key="w1")
    assert submitted["created"] is True and submitted["submitted_by"] == "bot-a"
    assert submitted["namespace"] == "a" and submitted["status"] == "pending"
    again = call(world, "http", "agent_a", "submit_job", plan=WAIT_PLAN, idempotency_key="w1")
    assert again["job_id"] == submitted["job_id"] and again["created"] is False
    job_id = submitted["job_id"]
    assert call(world, "http", "agent_a", "submit_job", plan=WAIT_PLAN, namespace="b") == (
        "error",
        "forbidden",
    )
    bad = call(world, "http", "agent_a", "submit_job", plan={"name": "x", "nodes": "no"})
    assert bad[0] == "error"
    assert _run(world, job_id) == "waiting"
    key = f"{job_id}:w"
    assert call(world, "http", "observer_a", "signal", job_id=job_id, key=key) == (
        "error",
        "forbidden",
    )
    assert call(world, "http", "agent_b", "signal", job_id=job_id, key=key) == (
        "error",
        "job_not_found",
    )
    done = call(world, "stdio", "agent_a", "signal", job_id=job_id, key=key, payload={"v": 1})
    assert done["appended"] is True and done["status"] == "pending"
    repeat = call(world, "http", "agent_a", "signal", job_id=job_id, key=key, payload={"v": 2})
    assert repeat["appended"] is False
    assert _run(world, job_id) == "completed"
    assert call(world, "http", "observer_a", "get_job", job_id=job_id)["output"] == {"w": {"v": 1}}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_approve_keeps_separation_of_duties(world: World, transport: str) -> None:
    submitted = call(world, transport, "agent_a", "submit_job", plan=APPROVAL_PLAN)
    job_id = submitted["job_id"]
    assert _run(world, job_id) == "waiting"
    key = f"{job_id}:ok"
    decide = {"job_id": job_id, "key": key}
    # the submitter never approves its own job: not as an agent, not with an approver key,
    # not by signalling the approval
    assert call(world, transport, "agent_a", "approve", **decide, approved=True) == (
        "error",
        "forbidden",
    )
    own = error_of(world, transport, "approver_bot_a", "approve", **decide, approved=True)
    assert own["code"] == "approval_forbidden"
    signalled = call(world, transport, "agent_a", "signal", **decide, payload={"approved": True})
    assert signalled == ("error", "approval_forbidden")
    assert call(world, transport, "observer_a", "get_job", job_id=job_id)["status"] == "waiting"
    approved = call(
        world, transport, "approver_a", "approve", **decide, approved=True, comment="fine"
    )
    assert approved["appended"] is True and approved["status"] == "pending"
    assert _run(world, job_id) == "completed"


@pytest.mark.parametrize(
    "options",
    [
        ["--transport", "http", "--path", "no-slash"],
        ["--transport", "http", "--path", "/a b"],
        ["--transport", "http", "--host", "999.1.1.1"],
        ["--transport", "http", "--port", "70000"],
        ["--transport", "carrier-pigeon"],
        ["--transport", "http", "--rate-limit", "many"],
        ["--transport", "http", "--session-idle-timeout", "nan"],
    ],
)
def test_a_bad_option_exits_3_with_a_message(world: World, options: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "affidavit", "mcp", *options],
        env={**os.environ, **world.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and re.search(r"[Ee]rror", proc.stderr)


def _stdio_with_tools(world: World, key: str) -> Any:
    from mcp.client.stdio import StdioServerParameters

    env = {**world.env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    env["AFFIDAVIT_API_KEY"] = world.keys[key]
    args = ["-m", "affidavit", "mcp", "--tools", "tests.integrations.mcp_submit_agent"]
    return StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(ROOT))


def _call_with_tools(world: World, key: str, tool: str, /, **args: Any) -> Any:
    from mcp.client.client import Client

    async def go() -> Any:
        async with Client(_stdio_with_tools(world, key)) as client:
            result = await client.call_tool(tool, args)
        if result.is_error:
            text = result.content[0].text  # type: ignore[union-attr]
            return ("error", json.loads(text[text.index("{") :])["error"])
        return result.structured_content

    return anyio.run(go)


def test_submit_job_takes_an_agent_registered_with_tools(world: World) -> None:
    """``affidavit mcp --tools MODULE`` submits the agents MODULE registers; without it an
    agent is not found, and the error says how to register it."""
    from tests.integrations.mcp_submit_agent import greeter

    submitted = _call_with_tools(
        world, "agent_a", "submit_job", agent="mcp_greeter", input={"name": "ada"}
    )
    assert submitted["created"] is True and submitted["submitted_by"] == "bot-a"
    tools = ToolRegistry([])
    tools.add_agent(greeter)
    with Runtime(world.db_url, tools=tools, signing_key=world.key_file) as rt:
        assert rt.run_job(submitted["job_id"]).status == "completed"
        assert rt.store.get_job(submitted["job_id"]).output == {"greeting": "hello ada"}
    wrong = _call_with_tools(world, "agent_a", "submit_job", agent="mcp_greeter", input={"x": 1})
    assert wrong[0] == "error" and wrong[1]["code"] == "invalid_plan"
    unknown = error_of(world, "http", "agent_a", "submit_job", agent="mcp_greeter")
    assert unknown["code"] == "invalid_plan" and "--tools" in unknown["hint"]


@pytest.mark.parametrize(
    "args",
    [{}, {"plan": WAIT_PLAN, "agent": "mcp_greeter"}],
    ids=["neither", "both"],
)
def test_submit_job_takes_exactly_one_of_plan_and_agent(world: World, args: dict[str, Any]) -> None:
    before = len(open_store(world.db_url).list_jobs(JobFilter(limit=1000)))
    refused = error_of(world, "http", "agent_a", "submit_job", **args)
    assert refused["code"] == "invalid_input" and "exactly one" in refused["message"]
    assert len(open_store(world.db_url).list_jobs(JobFilter(limit=1000))) == before


def test_submit_job_places_the_job_in_a_queue(world: World) -> None:
    """``queue``, ``priority``, ``partition_key`` and ``not_before`` reach the job's place: the
    queue's claim takes the higher priority first and nothing before ``not_before``."""
    store = open_store(world.db_url)
    set_queue(store, queue_config("mcp-q", priority=True))
    later = "2031-01-01T00:00:00Z"
    low = call(world, "http", "agent_a", "submit_job", plan=WAIT_PLAN, queue="mcp-q", priority=5)
    high = call(
        world,
        "http",
        "agent_a",
        "submit_job",
        plan=WAIT_PLAN,
        queue="mcp-q",
        priority=1,
        partition_key="customer-7",
    )
    held = call(
        world, "http", "agent_a", "submit_job", plan=WAIT_PLAN, queue="mcp-q", not_before=later
    )
    now = time.time()
    taken = [
        claim_from_queue(store, "mcp-q", owner="w", attempt_id=f"a{i}", now=now, lease_seconds=30)
        for i in range(3)
    ]
    assert [c.job_id if c else None for c in taken] == [high["job_id"], low["job_id"], None]
    start = datetime(2031, 1, 1, tzinfo=UTC).timestamp()
    after = claim_from_queue(
        store, "mcp-q", owner="w", attempt_id="a9", now=start + 1, lease_seconds=30
    )
    assert after is not None and after.job_id == held["job_id"]
    nowhere = error_of(world, "http", "agent_a", "submit_job", plan=WAIT_PLAN, queue="none-such")
    assert nowhere["code"] == "config_error" and "no queue" in nowhere["message"]
    bad = call(world, "http", "agent_a", "submit_job", plan=WAIT_PLAN, priority=2**40)
    assert bad[0] == "error"
    store.close()


def test_what_an_agent_sends_is_bounded_over_stdio_too(world: World) -> None:
    big = "x" * (1 << 20)
    refused = error_of(world, "stdio", "agent_a", "submit_job", plan=WAIT_PLAN, input=big)
    assert refused["code"] == "invalid_input" and "more than 1048576" in refused["message"]
    payload = error_of(
        world, "stdio", "agent_a", "signal", job_id=world.job_a, key="k", payload=big
    )
    assert payload["code"] == "invalid_input" and "the payload" in payload["message"]


def test_verify_pack_names_a_corrupted_archive(world: World) -> None:
    import base64

    exported = call(world, "http", "observer_a", "export_pack", job_id=world.job_a)
    data = base64.b64decode(exported["archive_base64"])
    damaged = data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:]  # the CRC-32
    encoded = base64.b64encode(damaged).decode()
    refused = error_of(world, "stdio", "observer_a", "verify_pack", archive_base64=encoded)
    assert refused["code"] == "invalid_pack_archive"
    assert "incorrect data check" in refused["message"]
