"""``@affidavit.mcp_reconcile``: a Python reconcile hook for a third-party MCP server's tool,
tried with npm's reference filesystem server (``@modelcontextprotocol/server-filesystem`` via
``npx``, when ``npx`` is present). An append (an ``edit_file`` that puts a row before ``END``:
repeated, it appends again) whose worker is killed after the server acted is found by the hook
on recovery and not repeated; one killed before the call is found missing and runs once.

Hook registration (before or after the tools, one resolution per tool) is tested against the
in-repo server (mcp_files_server.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import affidavit
from affidavit import ConfigError, Runtime, ToolContext, ToolRegistry, verify_job
from affidavit.integrations.mcp import McpCall, load_servers
from affidavit.packs import export_pack, verify_pack
from tests.integrations.test_mcp_client import servers_config
from tests.runtime.helpers import assert_log_sound, ledger_rows, wait_lease_expired

HERE = Path(__file__).parent
FS_TOOLS = HERE / "mcp_fs_tools.py"
FS_PACKAGE = "@modelcontextprotocol/server-filesystem@2026.8.31"
NPX = shutil.which("npx")
needs_npx = pytest.mark.skipif(NPX is None, reason="npx (Node.js) is not installed")

APPEND = {
    "name": "mcp-fs-append",
    "nodes": [
        {
            "id": "append",
            "type": "tool",
            "tool": "mcp:fs/edit_file",
            "args": {"path": "${input.path}", "edits": "${input.edits}"},
        }
    ],
}


def _fs_config(root: Path) -> dict[str, Any]:
    return {
        "servers": {
            "fs": {
                "command": [str(NPX), "-y", FS_PACKAGE, str(root)],
                "timeout_seconds": 120,
                "tools": {"read_text_file": {"kind": "pure"}},
            }
        }
    }


def _worker(url: str, config_file: Path, crash: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "AFFIDAVIT_CRASH_AT"}
    env["AFFIDAVIT_TEST_MCP_SERVERS"] = str(config_file)
    if crash is not None:
        env["AFFIDAVIT_CRASH_AT"] = crash
    command = [sys.executable, "-m", "affidavit", "worker", "--tools", str(FS_TOOLS)]
    command += ["--until-idle", "--lease-seconds", "1", "--db", url]
    return subprocess.run(command, env=env, timeout=300, check=False).returncode


def _append_killed(store_url: str, tmp_path: Path, crash: str) -> tuple[Runtime, str, Path]:
    root = (tmp_path / "files").resolve()
    root.mkdir()
    target = root / "log.txt"
    target.write_text("END\n")
    config_file = tmp_path / "servers.json"
    config_file.write_text(json.dumps(_fs_config(root)))
    reg = ToolRegistry()
    load_servers(_fs_config(root), registry=reg)  # (to validate the plan's tool)
    rt = Runtime(store_url, tools=reg)
    edits = [{"oldText": "END", "newText": "row-1\nEND"}]
    job_id = rt.submit(APPEND, {"path": str(target), "edits": edits}).job_id
    assert _worker(store_url, config_file, crash) == -9, "the worker did not die there"
    assert rt.get_job(job_id).status == "running"
    wait_lease_expired(rt.store, job_id)
    assert _worker(store_url, config_file) == 0
    return rt, job_id, target


@needs_npx
def test_an_append_killed_after_the_server_acted_is_found_not_repeated(
    store_url: str, tmp_path: Path
) -> None:
    rt, job_id, target = _append_killed(store_url, tmp_path, "tool.after_execute")
    with rt:
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        assert target.read_text() == "row-1\nEND\n"  # appended once, not twice
        [row] = ledger_rows(rt.store, job_id)
        assert row.status == "committed" and row.tool_name == "mcp:fs/edit_file"
        assert "found on recovery" in json.dumps(row.result)  # the hook's answer, recorded
        assert verify_job(rt.store, job_id).ok
        assert_log_sound(rt.store, job_id)
        pack = tmp_path / "pack"
        export_pack(rt.store, job_id, pack)
        assert verify_pack(pack).verdict == "MATCH"


@needs_npx
def test_an_append_killed_before_the_call_is_found_missing_and_runs_once(
    store_url: str, tmp_path: Path
) -> None:
    rt, job_id, target = _append_killed(store_url, tmp_path, "tool.after_acquire")
    with rt:
        job = rt.get_job(job_id)
        assert job.status == "completed", job.error
        assert target.read_text() == "row-1\nEND\n"
        [row] = ledger_rows(rt.store, job_id)
        assert row.status == "committed" and "found on recovery" not in json.dumps(row.result)
        outcomes = [
            e.payload["outcome"]
            for e in rt.store.list_events(job_id, limit=1000)
            if e.type == "tool_invocation_finished"
        ]
        assert outcomes == ["lost", "success"]  # the hook's "not found" closed the dead one
        assert verify_job(rt.store, job_id).ok
        assert_log_sound(rt.store, job_id)


def _hook(ctx: ToolContext, call: McpCall) -> Any:
    return {"found": call.arguments, "key": call.idempotency_key}


def test_a_hook_is_attached_before_or_after_the_tools(tmp_path: Path) -> None:
    early = tmp_path / "early"
    early.mkdir()
    affidavit.mcp_reconcile("hooked-early/write_file")(_hook)
    config = servers_config(early, {"read_file": {"kind": "pure"}})
    config["servers"] = {"hooked-early": config["servers"]["files"]}
    reg = ToolRegistry()
    load_servers(config, registry=reg)
    assert reg.get("mcp:hooked-early/write_file").reconcile_fn is not None
    assert reg.get("mcp:hooked-early/fail").reconcile_fn is None  # only the one named
    late = servers_config(tmp_path, {"read_file": {"kind": "pure"}})
    late["servers"] = {"hooked-late": late["servers"]["files"]}
    reg_late = ToolRegistry()
    load_servers(late, registry=reg_late)
    tool = reg_late.get("mcp:hooked-late/write_file")
    assert tool.reconcile_fn is None
    affidavit.mcp_reconcile("hooked-late/write_file")(_hook)
    assert tool.reconcile_fn is not None


def test_one_resolution_per_tool(tmp_path: Path) -> None:
    config = servers_config(tmp_path, {"write_file": {"reconcile": "find_write"}})
    config["servers"] = {"hooked-file": config["servers"]["files"]}
    load_servers(config, registry=ToolRegistry())
    with pytest.raises(ConfigError, match="resolved by its servers file"):
        affidavit.mcp_reconcile("hooked-file/write_file")(_hook)
    affidavit.mcp_reconcile("hooked-both/write_file")(_hook)
    both = servers_config(tmp_path, {"write_file": {"reconcile": "find_write"}})
    both["servers"] = {"hooked-both": both["servers"]["files"]}
    with pytest.raises(ConfigError, match="has a reconcile hook and"):
        load_servers(both, registry=ToolRegistry())
    with pytest.raises(ConfigError, match="has a reconcile hook already"):
        affidavit.mcp_reconcile("hooked-both/write_file")(lambda ctx, call: None)


@pytest.mark.parametrize("name", ["write_file", "mcp:files/write_file", "a b/c", "/x", ""])
def test_a_hook_names_server_and_tool(name: str) -> None:
    with pytest.raises(ConfigError, match="SERVER/TOOL"):
        affidavit.mcp_reconcile(name)
