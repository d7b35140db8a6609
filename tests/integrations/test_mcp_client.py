"""MCP tools through the ledger, against a real MCP server subprocess (tests/integrations/
mcp_files_server.py, written with the SDK's MCPServer), on both backends.

Each real write leaves a line in a side channel with the idempotency key the server received
in ``_meta``, so the counts below are what happened in the world. Worker processes are the real
CLI (`affidavit worker --tools mcp_tools.py`), killed by a named crash point (right after the
server answered, before the step's record) or by SIGKILL while the server is inside the call;
another worker process recovers the job."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from affidavit import ConfigError, Runtime, ToolRegistry, verify_job
from affidavit.integrations.mcp import load_servers
from affidavit.packs import export_pack, verify_pack
from tests.integrations.mcp_agent import archiver
from tests.packs.helpers import assay_verify
from tests.runtime.helpers import assert_log_sound, ledger_rows, wait_lease_expired

HERE = Path(__file__).parent
SERVER = HERE / "mcp_files_server.py"
TOOLS_MODULE = HERE / "mcp_tools.py"


def servers_config(
    tmp_path: Path, tools: dict[str, Any], *, hang: bool = False, url: str | None = None
) -> dict[str, Any]:
    env = {"FILES_SIDE": str(tmp_path / "side.jsonl")}
    if hang:
        env["FILES_HANG"] = str(tmp_path / "hanging")
    server: dict[str, Any] = (
        {"url": url} if url else {"command": [sys.executable, str(SERVER)], "env": env}
    )
    return {"servers": {"files": {**server, "tools": tools}}}


def writes(tmp_path: Path) -> list[dict[str, Any]]:
    side = tmp_path / "side.jsonl"
    if not side.exists():
        return []
    return [json.loads(x) for x in side.read_text().splitlines() if x.strip()]


def plan(tool: str = "write_file") -> dict[str, Any]:
    return {
        "name": "mcp-files",
        "nodes": [
            {
                "id": "write",
                "type": "tool",
                "tool": f"mcp:files/{tool}",
                "args": {"path": "${input.path}", "text": "hello"},
            },
            {
                "id": "read",
                "type": "pure",
                "tool": "mcp:files/read_file",
                "args": {"path": "${input.path}"},
                "depends_on": ["write"],
            },
        ],
    }


RECONCILED = {"write_file": {"reconcile": "find_write"}, "read_file": {"kind": "pure"}}
NO_RECONCILE = {"read_file": {"kind": "pure"}}
IDEMPOTENT = {"write_once": {"idempotent": True}, "read_file": {"kind": "pure"}}


def test_a_call_is_one_ledgered_step(store_url: str, tmp_path: Path) -> None:
    reg = ToolRegistry()
    names = load_servers(servers_config(tmp_path, RECONCILED), registry=reg)
    assert names == [
        "mcp:files/big",
        "mcp:files/fail",
        "mcp:files/find_write",
        "mcp:files/read_file",
        "mcp:files/write_file",
        "mcp:files/write_once",
    ]
    out = tmp_path / "out.txt"
    with Runtime(store_url, tools=reg) as rt:
        job = rt.submit(plan(), {"path": str(out)})
        done = rt.run_job(job.job_id)
        assert done.status == "completed"
        assert done.output == {"read": {"lines": ["hello"]}}
        [row] = ledger_rows(rt.store, job.job_id)
        [line] = writes(tmp_path)
        # the server received the step's external key in _meta, and it is what was recorded
        assert line["key"].startswith(f"affidavit:{job.job_id}:{row.step_id}:")
        assert row.status == "committed" and row.result == line["result"]
        assert row.result["key"] == line["key"]
        # a finished job is not run again: the server is not asked again
        assert rt.run_job(job.job_id).status == "completed"
        assert len(writes(tmp_path)) == 1 and out.read_text() == "hello\n"
        assert verify_job(rt.store, job.job_id).ok
        assert_log_sound(rt.store, job.job_id)


def test_a_tool_error_fails_the_step_without_committing(store_url: str, tmp_path: Path) -> None:
    reg = ToolRegistry()
    load_servers(servers_config(tmp_path, {}), registry=reg)
    failing = {
        "name": "mcp-fail",
        "nodes": [{"id": "f", "type": "tool", "tool": "mcp:files/fail", "args": {"reason": "no"}}],
    }
    with Runtime(store_url, tools=reg) as rt:
        job = rt.run_job(rt.submit(failing, {}).job_id)
        assert job.status == "failed"
        assert "answered with an error" in json.dumps(job.error)
        [row] = ledger_rows(rt.store, job.job_id)
        assert row.status == "failed"


def test_an_answer_over_the_cap_fails_the_step(store_url: str, tmp_path: Path) -> None:
    reg = ToolRegistry()
    load_servers(servers_config(tmp_path, {"big": {"kind": "pure"}}), registry=reg)
    huge = {
        "name": "mcp-big",
        "nodes": [{"id": "b", "type": "pure", "tool": "mcp:files/big", "args": {"n": 9 << 20}}],
    }
    with Runtime(store_url, tools=reg) as rt:
        job = rt.run_job(rt.submit(huge, {}).job_id)
        assert job.status == "failed"
        assert "more than 8388608" in json.dumps(job.error)


def _worker_env(config_file: Path, crash: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AFFIDAVIT_CRASH_AT"}
    env["AFFIDAVIT_TEST_MCP_SERVERS"] = str(config_file)
    if crash is not None:
        env["AFFIDAVIT_CRASH_AT"] = crash
    return env


def _worker(url: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "affidavit",
        "worker",
        "--tools",
        str(TOOLS_MODULE),
        "--until-idle",
        "--lease-seconds",
        "1",
        "--db",
        url,
    ]


def _crash_and_recover(
    store_url: str,
    tmp_path: Path,
    tools: dict[str, Any],
    how: str,
    tool: str = "write_file",
    as_agent: bool = False,
) -> tuple[Runtime, str]:
    """Submit, kill a worker process ``how`` (a crash point, or SIGKILL inside the call),
    recover in another worker process; return the runtime (open) and the job id."""
    config = servers_config(tmp_path, tools, hang=how == "inside_call")
    config_file = tmp_path / "servers.json"
    config_file.write_text(json.dumps(config))
    reg = ToolRegistry()
    load_servers(config, registry=reg)
    out = tmp_path / "out.txt"
    rt = Runtime(store_url, tools=reg)
    if as_agent:
        reg.add_agent(archiver)
        job_id = rt.submit(archiver, {"path": str(out), "text": "hello"}).job_id
    else:
        job_id = rt.submit(plan(tool), {"path": str(out)}).job_id
    if how == "inside_call":
        proc = subprocess.Popen(_worker(store_url), env=_worker_env(config_file))
        end = time.monotonic() + 120
        while not (tmp_path / "hanging").exists():  # the server acted and is inside the call
            assert proc.poll() is None and time.monotonic() < end, "the call never arrived"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -9
    else:
        crashed = subprocess.run(
            _worker(store_url),
            env=_worker_env(config_file, how),
            timeout=120,
            check=False,
        )
        assert crashed.returncode == -9, "the worker did not die at the crash point"
    assert len(writes(tmp_path)) == 1  # the server's effect happened, its record did not
    assert rt.get_job(job_id).status == "running"
    wait_lease_expired(rt.store, job_id)
    recovered = subprocess.run(
        _worker(store_url), env=_worker_env(config_file), timeout=120, check=False
    )
    assert recovered.returncode == 0
    return rt, job_id


@pytest.mark.parametrize("how", ["tool.after_execute", "inside_call"])
def test_killed_worker_recovers_with_reconcile_effect_once(
    store_url: str, tmp_path: Path, how: str
) -> None:
    rt, job_id = _crash_and_recover(store_url, tmp_path, RECONCILED, how)
    with rt:
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        [line] = writes(tmp_path)  # the server wrote once
        assert (tmp_path / "out.txt").read_text() == "hello\n"
        [row] = ledger_rows(rt.store, job_id)
        # the recorded result is the dead attempt's real one, found by its key
        assert row.status == "committed" and row.result == line["result"]
        assert verify_job(rt.store, job_id).ok
        assert_log_sound(rt.store, job_id)
        pack = tmp_path / "pack"
        export_pack(rt.store, job_id, pack)
        assert verify_pack(pack).verdict == "MATCH"
        code, receipt, _ = assay_verify(pack, tmp_path / "assay-out")
        assert (code, receipt.get("verdict")) == (0, "MATCH"), receipt


@pytest.mark.parametrize("how", ["tool.after_execute", "inside_call"])
def test_agent_with_an_mcp_tool_killed_and_recovered_effect_once(
    store_url: str, tmp_path: Path, how: str
) -> None:
    rt, job_id = _crash_and_recover(store_url, tmp_path, RECONCILED, how, as_agent=True)
    with rt:
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        [line] = writes(tmp_path)
        assert job.output == {"written": line["result"], "lines": ["hello"]}
        assert (tmp_path / "out.txt").read_text() == "hello\n"
        [row] = ledger_rows(rt.store, job_id)
        assert row.status == "committed" and row.tool_name == "mcp:files/write_file"
        assert_log_sound(rt.store, job_id)
        assert verify_job(rt.store, job_id).ok
        pack = tmp_path / "pack"
        export_pack(rt.store, job_id, pack)
        assert verify_pack(pack).verdict == "MATCH"
        code, receipt, _ = assay_verify(pack, tmp_path / "assay-out")
        assert (code, receipt.get("verdict")) == (0, "MATCH"), receipt


def test_killed_worker_with_an_idempotent_server_repeats_the_key(
    store_url: str, tmp_path: Path
) -> None:
    rt, job_id = _crash_and_recover(
        store_url, tmp_path, IDEMPOTENT, "tool.after_execute", tool="write_once"
    )
    with rt:
        assert rt.get_job(job_id).status == "completed"
        [line] = writes(tmp_path)
        [row] = ledger_rows(rt.store, job_id)
        assert row.result == line["result"]
        assert (tmp_path / "out.txt").read_text() == "hello\n"


def test_killed_worker_without_reconcile_parks(store_url: str, tmp_path: Path) -> None:
    rt, job_id = _crash_and_recover(store_url, tmp_path, NO_RECONCILE, "tool.after_execute")
    with rt:
        job = rt.get_job(job_id)
        assert job.status == "parked"  # nobody can tell: never re-run blindly
        assert len(writes(tmp_path)) == 1
        assert (tmp_path / "out.txt").read_text() == "hello\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_streamable_http_server(store_url: str, tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "FILES_SIDE": str(tmp_path / "side.jsonl")}
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], env=env)
    try:
        end = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < end
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        reg = ToolRegistry()
        config = servers_config(tmp_path, RECONCILED, url=f"http://127.0.0.1:{port}/mcp")
        load_servers(config, registry=reg)
        with Runtime(store_url, tools=reg) as rt:
            job = rt.run_job(rt.submit(plan(), {"path": str(tmp_path / "o.txt")}).job_id)
            assert job.status == "completed"
            [line] = writes(tmp_path)
            [row] = ledger_rows(rt.store, job.job_id)
            assert row.result == line["result"] and line["key"].startswith("affidavit:")
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"servers": {"x": {}}}, "give either command (stdio) or url"),
        ({"servers": {"a/b": {"url": "http://h/mcp"}}}, "server name 'a/b'"),
        ({"servers": {"x": {"url": "ftp://h"}}}, "servers.x.url"),
        (
            {"servers": {"x": {"url": "http://h/mcp", "tools": {"t": {"kind": "pure",
                                                                     "idempotent": True}}}}},
            "a pure tool has no in-flight resolution",
        ),
        ({"servers": {"x": {"url": "http://h/mcp", "bogus": 1}}}, "servers.x.bogus"),
    ],
)  # fmt: skip
def test_bad_servers_file_is_refused(config: dict[str, Any], message: str) -> None:
    reg = ToolRegistry()
    with pytest.raises(ConfigError) as caught:
        load_servers(config, registry=reg)
    assert message in caught.value.message
    assert len(reg) == 0


def test_options_for_a_tool_the_server_lacks_are_refused(tmp_path: Path) -> None:
    reg = ToolRegistry()
    with pytest.raises(ConfigError, match="has no tool 'nope'"):
        load_servers(servers_config(tmp_path, {"nope": {}}), registry=reg)
    assert len(reg) == 0


def test_servers_file_duplicate_key_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "s.json"
    bad.write_text('{"servers": {}, "servers": {}}')
    with pytest.raises(ConfigError, match="given twice"):
        load_servers(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_servers(tmp_path / "missing.json")
