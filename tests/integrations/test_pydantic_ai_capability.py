"""``AffidavitDurability``, Pydantic AI's durability capability for affidavit, with the real
library (scripted ``FunctionModel``s, a real MCP server subprocess) on both backends: its
persisted step names pinned; the tool calls of one model turn run at once, each once through
the ledger and named after its tool; a conditionally approved ``@affidavit.tool`` keeps its
``reconcile`` hook across an approval and a killed worker; an MCP toolset's tool list is
recorded and its calls carry the step's keys in ``_meta``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.durable_exec import JSON_CODEC
from pydantic_ai.models.test import TestModel

import affidavit
from affidavit import Runtime, ToolRegistry
from affidavit.integrations.pydantic_ai import RECORD_FORMAT, AffidavitDurability
from tests.integrations import pydai_cap_tools as ct
from tests.integrations import pydai_tools as pt
from tests.integrations.test_pydantic_ai import cli, run_until_done, step_calls, submit

CAP_TOOLS = Path(ct.__file__)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {"PYDAI_SIDE": str(tmp_path / "side.jsonl"), "PYDAI_LEDGER": str(tmp_path / "ledger")}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def test_the_persisted_names_are_pinned() -> None:
    """The names and versions a job records are compatibility data: changing one strands the
    jobs in flight (a worker recovers a job only with the steps it recorded)."""
    pytest.importorskip("fastmcp", reason="pydantic_ai's MCPToolset needs fastmcp (dev extra)")
    from pydantic_ai.mcp import MCPToolset

    durability = AffidavitDurability(tools=[ct.pay])
    toolset = MCPToolset("http://127.0.0.1:9/mcp", id="files")
    agent = Agent(TestModel(), name="pydai_pin", toolsets=[toolset], capabilities=[durability])

    @agent.tool_plain
    def lookup(q: str) -> str:
        return q

    made = {(t.name, t.kind, t.version) for t in durability.registrations[1:]}
    assert made == {
        ("pydai_pin.model_request", "pure", "1"),
        ("pydai_pin.operation", "pure", "1"),
        ("pydai_pin.tool.lookup", "tool", "1"),
        ("pydai_pin.mcp.files.call_tool", "tool", "1"),
        ("pydai_pin.mcp.files.get_tools", "pure", "1"),
        ("pydai_pin.mcp.files.get_instructions", "pure", "1"),
        ("pydai_pay", "tool", "1"),
    }
    job = durability.registrations[0]
    assert (job.name, job.version) == ("pydai_pin", RECORD_FORMAT)
    assert RECORD_FORMAT == "affidavit-pydantic-ai/2"
    spec = AffidavitDurability.engine_spec
    assert spec.codec is JSON_CODEC
    assert dict(spec.toolset_lifecycles) == {
        "function": "enter-always",
        "mcp": "enter-in-durable-unit",
        "dynamic": "enter-never",
    }
    assert spec.journal_discovery and not spec.sequential_tools_in_durable_context


def test_the_tool_calls_of_one_turn_run_at_once_each_once(store_url: str, env: Any) -> None:
    """``left`` and ``right`` meet at a barrier: run one at a time the first would wait alone
    and fail. Each is its own tool step, named after the tool with its own arguments,
    committed once; each model response's usage is recorded with its step."""
    with Runtime(store_url, tools=ToolRegistry(ct.durability.registrations)) as rt:
        job_id = rt.submit("pydai_cap", {"prompt": "both"}).job_id
        done = rt.run_job(job_id)
        assert done.status == "completed", done.error
        assert done.output == {"output": "done: both"}
        calls = [(c["kind"], c["tool_name"], c["args"]) for c in step_calls(rt, job_id)]
        assert [c[:2] for c in calls] == [
            ("pure", "pydai_cap.model_request"),
            ("tool", "pydai_cap.tool.left"),
            ("tool", "pydai_cap.tool.right"),
            ("pure", "pydai_cap.model_request"),
        ]
        assert [c[2] for c in calls[1:3]] == [{"n": 1}, {"n": 2}]
        events = rt.store.list_events(job_id)
        finished = [e.payload for e in events if e.type == "node_finished"]
        committed = [
            f["node_id"] for f in finished if f.get("result_type") == "side_effect_committed"
        ]
        assert sorted(committed) == ["#1", "#2"]
        usage = [f["usage"] for f in finished if "usage" in f]
        assert usage == [{"tokens": 15}, {"tokens": 16}]  # (input + output of each response)
        assert rt.run_job(job_id).status == "completed"  # run again: nothing runs again
        assert affidavit.verify_job(rt.store, job_id).ok
    kinds = [line["kind"] for line in pt.read_side(Path(env["PYDAI_SIDE"]))]
    assert sorted(kinds) == ["left", "model", "model", "right"]


def test_a_conditionally_approved_tool_keeps_its_reconcile_hook(
    store_url: str, env: dict[str, str]
) -> None:
    """``pydai_pay`` needs an approval above 100 (the runtime's approval gate, decided by
    another principal than the submitter); approved, killed after it paid and before its
    record, the recovery asks its ``reconcile`` hook and does not pay again."""
    small = submit(store_url, CAP_TOOLS, {"prompt": "pay 50"}, env, "pydai_cap")
    assert run_until_done(store_url, small, env, tools=CAP_TOOLS)["status"] == "completed"
    job_id = submit(store_url, CAP_TOOLS, {"prompt": "pay 500"}, env, "pydai_cap")
    shown = run_until_done(store_url, job_id, env, tools=CAP_TOOLS)
    assert shown["status"] == "waiting", shown
    ledger = Path(env["PYDAI_LEDGER"])
    assert [line.split()[0] for line in ledger.read_text().splitlines()] == ["50"]
    with Runtime(store_url, tools=ToolRegistry(ct.durability.registrations)) as rt:
        [waiting] = [e.payload for e in rt.store.list_events(job_id) if e.type == "job_waiting"]
    key = waiting["correlation_key"]
    signalled = cli("signal", job_id, "--key", key, "--payload", '{"approved": true}',
                    "--as", "ann", "--db", store_url)  # fmt: skip
    assert signalled.returncode == 0, signalled.stderr
    crash = {**env, "AFFIDAVIT_CRASH_AT": "tool.after_execute:1"}
    killed = cli("worker", "--tools", str(CAP_TOOLS), "--until-idle", "--lease-seconds", "1",
                 "--db", store_url, env=crash)  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    shown = run_until_done(store_url, job_id, env, tools=CAP_TOOLS)
    assert shown["status"] == "completed", shown
    assert shown["output"] == {"output": "done: pay 500"}
    assert [line.split()[0] for line in ledger.read_text().splitlines()] == ["50", "500"]
    lines = pt.read_side(Path(env["PYDAI_SIDE"]))
    assert [line["amount"] for line in lines if line["kind"] == "reconcile"] == [500]
    # each job's model asked turn 0 and turn 1 once, across every worker
    assert sorted(line["turn"] for line in lines if line["kind"] == "model") == [0, 0, 1, 1]
    verified = cli("verify", job_id, "--db", store_url, "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"] is True, verified.stdout


def test_an_mcp_toolset_lists_once_per_turn_and_calls_with_the_keys(
    store_url: str, tmp_path: Path
) -> None:
    """Pydantic AI's MCPToolset (a real MCP server subprocess over stdio): its tool list is a
    recorded step, each ``tools/call`` one tool step whose idempotency key and job id reach
    the server in ``_meta``."""
    pytest.importorskip("fastmcp", reason="pydantic_ai's MCPToolset needs fastmcp (dev extra)")
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    out, files_side = tmp_path / "mcp-out.txt", tmp_path / "files-side.jsonl"
    server = Path(__file__).with_name("mcp_files_server.py")
    asked: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        asked.append(turn)
        if turn == 0:
            args = {"path": str(out), "text": "via mcp"}
            return ModelResponse(parts=[ToolCallPart("write_file", args, tool_call_id="m-1")])
        return ModelResponse(parts=[TextPart("written")])

    transport = StdioTransport(sys.executable, [str(server)], env={"FILES_SIDE": str(files_side)})
    name = f"pydai_mcp_{tmp_path.name[-12:]}"
    durability = AffidavitDurability(version="1")
    Agent(
        FunctionModel(model),
        name=name,
        toolsets=[MCPToolset(transport, id="files")],
        capabilities=[durability],
    )
    with Runtime(store_url, tools=ToolRegistry(durability.registrations)) as rt:
        job_id = rt.submit(name, {"prompt": "save it"}).job_id
        done = rt.run_job(job_id)
        assert done.status == "completed", done.error
        assert done.output == {"output": "written"}
        calls = step_calls(rt, job_id)
        tool_steps = [c for c in calls if c["kind"] == "tool"]
        assert [(c["tool_name"], c["args"]["tool"], c["args"]["call_id"]) for c in tool_steps] == [
            (f"{name}.mcp.files.call_tool", "write_file", "m-1")
        ]
        listed = {c["node_id"] for c in calls if c["tool_name"] == f"{name}.mcp.files.get_tools"}
        assert listed  # the server's tool list, as the run saw it
        outputs = {
            e.payload["node_id"]: e.payload.get("output")
            for e in rt.store.list_events(job_id)
            if e.type == "node_finished"
        }
        assert all("write_file" in outputs[node] for node in listed)
        assert affidavit.verify_job(rt.store, job_id).ok
    assert out.read_text().splitlines() == ["via mcp"]
    [write] = [json.loads(x) for x in files_side.read_text().splitlines()]
    assert write["job"] == job_id
    assert isinstance(write["key"], str) and len(write["key"]) >= 32
    assert asked == [0, 1]


def test_a_dynamic_toolsets_calls_are_tool_steps(store_url: str, tmp_path: Path) -> None:
    """A ``DynamicToolset``'s tools are listed in a pure step and called as tool steps
    through the ledger (not recorded as pure outputs: a call caught in flight is not run
    again)."""
    from pydantic_ai.toolsets import DynamicToolset, FunctionToolset

    ran: list[int] = []

    def bump(n: int) -> int:
        ran.append(n)
        return n + 1

    name = f"pydai_dyn_{tmp_path.name[-12:]}"
    durability = AffidavitDurability(version="1")
    Agent(
        TestModel(),
        name=name,
        toolsets=[DynamicToolset(lambda ctx: FunctionToolset([bump]), id="dyn")],
        capabilities=[durability],
    )
    with Runtime(store_url, tools=ToolRegistry(durability.registrations)) as rt:
        job_id = rt.submit(name, {"prompt": "go"}).job_id
        done = rt.run_job(job_id)
        assert done.status == "completed", done.error
        calls = [(c["kind"], c["tool_name"]) for c in step_calls(rt, job_id)]
        assert ("tool", f"{name}.dynamic.dyn.call_tool") in calls
        assert ("pure", f"{name}.dynamic.dyn.get_tools") in calls
        assert affidavit.verify_job(rt.store, job_id).ok
    assert ran == [0]
