"""``affidavit mcp`` as a real subprocess, over stdio and streamable HTTP, on both backends,
driven by the MCP SDK's own client: tools/list, and tools/call of every tool with each role.

A refused call is an MCP tool error whose text is ``{"error": {"code", ...}}`` and changes
nothing (the claimant's verification count stays the same)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.claims import ClaimService
from affidavit.claims.sealing import TrustSealer
from affidavit.faces.auth import create_api_key
from affidavit.store import open_store

TOOL_NAMES = {
    "verify_job",
    "export_pack",
    "verify_pack",
    "verify_claim",
    "get_trust",
    "list_jobs",
    "get_job",
    "submit_job",
    "signal",
    "approve",
}


def _act(ctx: ToolContext, x: int) -> dict[str, Any]:
    return {"did": ctx.node_id, "x": x}


TOOLS = ToolRegistry([Tool("mcp_srv_act", _act, "tool")])
PLAN = {
    "name": "mcp-server-test",
    "nodes": [{"id": "a", "type": "tool", "tool": "mcp_srv_act", "args": {"x": "${input.x}"}}],
}


@dataclass
class World:
    db_url: str
    keys: dict[str, str]
    key_file: Path
    job_a: str  # a completed job in namespace a
    job_b: str  # one in namespace b
    env: dict[str, str]
    http_url: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        assert proc.poll() is None, f"affidavit mcp exited with {proc.returncode}"
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(f"affidavit mcp did not listen on {url}")


@pytest.fixture(scope="module")
def world(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    key_file = tmp_path_factory.mktemp("keys") / "affidavit-signing.key"
    store = open_store(db_url)
    keys = {}
    for name, agent, role, ns in [
        ("observer_a", "watcher-a", "observer", "a"),
        ("agent_a", "bot-a", "agent", "a"),
        ("agent_b", "bot-b", "agent", "b"),
        ("admin", "root", "admin", "ops"),
        ("approver_a", "judge-a", "approver", "a"),
        ("approver_bot_a", "bot-a", "approver", "a"),  # the agent bot-a, holding an approver key
    ]:
        _, keys[name] = create_api_key(store, agent_id=agent, role=role, namespace=ns)
    service = ClaimService(store, sealer=TrustSealer(key_file))  # (one key seals here)
    for agent_id, namespace, role in [
        ("watcher-a", "a", "observer"),
        ("bot-a", "a", "agent"),
        ("bot-b", "b", "agent"),
        ("worker-a", "a", "agent"),
        ("root", "ops", "admin"),
    ]:
        service.add_agent(agent_id, namespace=namespace, role=role)
    with Runtime(db_url, tools=TOOLS, signing_key=key_file) as rt:
        job_a = rt.submit(PLAN, {"x": 1}, namespace="a").job_id
        job_b = rt.submit(PLAN, {"x": 2}, namespace="b").job_id
        assert rt.run_job(job_a).status == "completed"
        assert rt.run_job(job_b).status == "completed"
    store.close()
    env = {"AFFIDAVIT_SIGNING_KEY": str(key_file), "AFFIDAVIT_DATABASE_URL": db_url}
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "mcp", "--transport", "http", "--port", str(port)],
        env={**os.environ, **env},
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc)
        yield World(db_url, keys, key_file, job_a, job_b, env, f"http://127.0.0.1:{port}/mcp")
    finally:
        proc.terminate()
        proc.wait(10)


def _stdio(world: World, key: str | None) -> StdioServerParameters:
    env = {**world.env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    if key is not None:
        env["AFFIDAVIT_API_KEY"] = world.keys[key]
    return StdioServerParameters(command=sys.executable, args=["-m", "affidavit", "mcp"], env=env)


def _http(world: World, key: str | None) -> Any:
    headers = {} if key is None else {"Authorization": f"Bearer {world.keys[key]}"}
    return streamable_http_client(world.http_url, http_client=create_mcp_http_client(headers))


def connect(world: World, transport: str, key: str | None) -> Client:
    target = _stdio(world, key) if transport == "stdio" else _http(world, key)
    return Client(target)


def call(world: World, transport: str, key: str | None, tool: str, /, **args: Any) -> Any:
    """One tools/call on a fresh connection: the structured result, or ``("error", code)``."""

    async def go() -> Any:
        async with connect(world, transport, key) as client:
            result = await client.call_tool(tool, args)
        if result.is_error:
            text = result.content[0].text  # type: ignore[union-attr]
            assert text.startswith(f"Error executing tool {tool}: ")
            return ("error", json.loads(text[text.index("{") :])["error"]["code"])
        return result.structured_content

    return anyio.run(go)


TRANSPORTS = ["stdio", "http"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tools_list(world: World, transport: str) -> None:
    async def go() -> set[str]:
        async with connect(world, transport, "observer_a") as client:
            listed = await client.list_tools()
        return {t.name for t in listed.tools}

    assert anyio.run(go) == TOOL_NAMES


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_verify_job(world: World, transport: str) -> None:
    result = call(world, transport, "observer_a", "verify_job", job_id=world.job_a)
    assert result["ok"] is True and result["job_id"] == world.job_a
    assert result["seal"]["ok"] is True
    # another namespace's job is unknown, exactly like a missing one
    assert call(world, transport, "observer_a", "verify_job", job_id=world.job_b) == (
        "error",
        "job_not_found",
    )
    assert call(world, transport, "observer_a", "verify_job", job_id="nope") == (
        "error",
        "job_not_found",
    )


def test_http_without_a_key_is_unauthorized(world: World) -> None:
    """Over HTTP no session opens without a key: the client's first request is answered 401
    (tests/integrations/test_mcp_http_gate.py has the rest)."""
    with pytest.raises(BaseException) as refused:  # (an exception group)
        call(world, "http", None, "verify_job", job_id=world.job_a)
    assert "Server returned an error response" in _messages(refused.value)
    response = httpx.post(world.http_url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"


def _messages(exc: BaseException) -> str:
    """The messages of ``exc`` and of every exception it groups."""
    inner = getattr(exc, "exceptions", ())
    return " ".join([str(exc), *(_messages(e) for e in inner)])


def _verifications(world: World) -> int:
    store = open_store(world.db_url)
    try:
        return ClaimService(store).get_agent("worker-a").verifications
    finally:
        store.close()


CLAIM = {"agent_id": "worker-a", "claim_type": "custom", "claim": {"return_code": 0}}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_verify_claim(world: World, transport: str) -> None:
    before = _verifications(world)
    # The caller writes what the claimant claims: admins only (agents verify recorded claims).
    verdict = call(world, transport, "admin", "verify_claim", **CLAIM, command="true")
    assert verdict["accurate"] is True and verdict["decided_by"] == "return_code"
    assert verdict["actual"]["return_code"] == 0
    assert _verifications(world) == before + 1
    inaccurate = call(world, transport, "admin", "verify_claim", **CLAIM, command="false")
    assert inaccurate["accurate"] is False
    assert _verifications(world) == before + 2


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("key", "args", "code"),
    [
        ("observer_a", {}, "forbidden"),  # the role is below `admin`: nothing runs
        ("agent_a", {}, "forbidden"),  # an agent may not write what another claimed
        ("agent_b", {}, "forbidden"),
        ("admin", {"agent_id": "root"}, "self_verification"),
        ("admin", {"command": "sh -c true"}, "command_not_allowed"),
        ("admin", {"timeout_s": 500}, "invalid_input"),  # above the HTTP API's cap (120 s)
    ],
)
def test_verify_claim_refused(
    world: World, transport: str, key: str, args: dict[str, Any], code: str
) -> None:
    before = _verifications(world)
    refused = call(world, transport, key, "verify_claim", **{**CLAIM, "command": "true", **args})
    assert refused == ("error", code)
    assert _verifications(world) == before  # nothing ran, nothing was written


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_get_trust(world: World, transport: str) -> None:
    trust = call(world, transport, "observer_a", "get_trust", agent_id="worker-a")
    assert trust["agent_id"] == "worker-a" and 0 <= trust["trust_score"] <= 1
    assert call(world, transport, "agent_b", "get_trust", agent_id="worker-a") == (
        "error",
        "agent_not_found",
    )


def test_export_and_verify_pack(world: World) -> None:
    exported = call(world, "http", "observer_a", "export_pack", job_id=world.job_a)
    assert exported["filename"] == f"pack-{world.job_a}.tar.gz"
    verdict = call(
        world, "stdio", "observer_a", "verify_pack", archive_base64=exported["archive_base64"]
    )
    assert verdict["verdict"] == "MATCH" and verdict["ok"] is True
    assert call(world, "http", "agent_b", "export_pack", job_id=world.job_a) == (
        "error",
        "job_not_found",
    )


def test_verify_pack_refuses_what_is_no_pack(world: World, tmp_path: Path) -> None:
    import base64
    import io
    import tarfile

    assert call(world, "http", "observer_a", "verify_pack", archive_base64="%%%") == (
        "error",
        "invalid_pack_archive",
    )
    buffer = io.BytesIO()  # an archive with a symlink escaping the directory
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        link = tarfile.TarInfo("pack-x/evil")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    encoded = base64.b64encode(buffer.getvalue()).decode()
    assert call(world, "http", "observer_a", "verify_pack", archive_base64=encoded) == (
        "error",
        "invalid_pack_archive",
    )


def test_stdio_needs_a_key(world: World) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "affidavit", "mcp"],
        env={k: v for k, v in {**os.environ, **world.env}.items() if k != "AFFIDAVIT_API_KEY"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3
    assert "AFFIDAVIT_API_KEY is not set" in proc.stderr
