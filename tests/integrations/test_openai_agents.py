"""The OpenAI Agents SDK (the real library, a scripted ``Model``) run by ``AffidavitRunner`` in
an affidavit agent job on both backends: every model call a recorded pure step, every function
tool call a tool step through the ledger; a worker killed after a tool committed (and one killed
between a write and its record) recovered by another worker with each effect once and
the model not asked again for a recorded turn; the pack MATCH under assay's verifier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import affidavit
from affidavit import ConfigError, Runtime, ToolRegistry
from affidavit.integrations.openai_agents import STEPS, AffidavitRunner, ledger_tool
from tests.cli.test_cli import cli as any_cli
from tests.integrations import oai_tools as ot
from tests.packs.helpers import assay_verify

TOOLS = Path(ot.__file__)
SRC = str(Path(affidavit.__file__).resolve().parents[1])


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``affidavit ARGS`` with ``env`` over this process's environment (without its database
    URL): tests/cli/test_cli.py's ``cli``, which runs a worker, ``jobs show`` or ``signal`` in
    this process and a call with a crash point in a process of its own."""
    outer = {k: v for k, v in os.environ.items() if k != "AFFIDAVIT_DATABASE_URL"}
    return any_cli(*args, env={**outer, **(env or {})})


@pytest.fixture
def side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "side.jsonl"
    monkeypatch.setenv("OAI_SIDE", str(path))
    return path


def registry() -> ToolRegistry:
    return ToolRegistry([*STEPS, *ot.REGISTRATIONS])


def step_calls(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in rt.store.list_events(job_id) if e.type == "step_called"]


def worker(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``affidavit worker --until-idle`` with the agent's tools file, a short lease."""
    return cli("worker", "--tools", str(TOOLS), "--until-idle", "--lease-seconds", "1",
               "--db", url, env=env)  # fmt: skip


def run_until_done(url: str, job_id: str, env: dict[str, str]) -> dict[str, Any]:
    """Workers until the job ends or waits: a dead worker's lease must expire
    before another can take the job, so this polls, bounded."""
    deadline = time.monotonic() + 120
    while True:
        ran = worker(url, env)
        assert ran.returncode == 0, ran.stderr
        shown = json.loads(cli("jobs", "show", job_id, "--db", url, "--json").stdout)
        if shown["status"] not in ("pending", "running") or time.monotonic() > deadline:
            return dict(shown)
        time.sleep(0.2)


def test_the_step_names_are_pinned() -> None:
    """Jobs record these names and versions: renaming one strands every recorded job."""
    assert [(t.name, t.kind, t.version) for t in STEPS] == [
        ("openai_agents.model_response", "pure", "1"),
        ("openai_agents.call_tool", "tool", "1"),
        ("openai_agents.call_tool_approved", "tool", "1"),
        ("openai_agents.guardrail", "pure", "1"),
    ]
    assert [t.requires_approval for t in STEPS] == [False, False, True, False]


def test_steps_recorded_once_each(store_url: str, side: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    with Runtime(store_url, tools=registry()) as rt:
        job = rt.submit("oai_support", {"prompt": f"write hello to {out}"})
        done = rt.run_job(job.job_id)
        assert done.status == "completed", done.error
        assert done.output == {"output": f"wrote 'hello' to {out}"}
        calls = step_calls(rt, job.job_id)
        assert [(c["kind"], c["tool_name"]) for c in calls] == [
            ("pure", "openai_agents.guardrail"),
            ("pure", "openai_agents.model_response"),
            ("tool", "openai_agents.call_tool"),
            ("pure", "openai_agents.model_response"),
            ("tool", "oai_write_file"),
            ("pure", "openai_agents.model_response"),
        ]
        assert calls[2]["args"] == {"tool": "lookup", "args": {"q": "hello"}, "call_id": "call-1"}
        assert calls[4]["args"] == {"path": str(out), "text": "hello"}
        assert [c["args"]["turn"] for c in calls if c["tool_name"].endswith("model_response")] == [
            0,
            1,
            2,
        ]
        finished = {
            e.payload["node_id"]: e.payload
            for e in rt.store.list_events(job.job_id)
            if e.type == "node_finished"
        }
        first = finished["#1"]
        assert first["output"]["output"][0]["name"] == "lookup"
        assert first["usage"] == {"tokens": 500}  # each response's tokens, for budgets
        assert finished["#0"]["output"] == {
            "tripwire_triggered": False,
            "output_info": {"checked": True},
        }
        [looked_up] = [
            e.payload
            for e in rt.store.list_events(job.job_id)
            if e.type == "tool_invocation_finished" and e.payload["node_id"] == "#2"
        ]
        assert looked_up["result"] == {"return": {"q": "hello", "known": True}}
        assert affidavit.verify_job(rt.store, job.job_id).ok
    assert out.read_text().count("hello") == 1
    kinds = [line["kind"] for line in ot.read_side(side)]
    assert kinds == ["guardrail", "model", "lookup", "model", "model"]


def test_killed_after_a_tool_committed_recovers_once_without_asking_the_model_again(
    store_url: str, side: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    with Runtime(store_url, tools=registry()) as rt:
        job_id = rt.submit("oai_support", {"prompt": f"write hello to {out}"}).job_id
    env = {"OAI_SIDE": str(side)}
    # the second tool commit is the file write's: the worker dies right after it
    killed = worker(store_url, {**env, "AFFIDAVIT_CRASH_AT": "tool.after_commit:2"})
    assert killed.returncode == -9, killed.stderr
    assert out.read_text().count("hello") == 1
    first_pid = {line["pid"] for line in ot.read_side(side)}
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "completed", shown
    assert out.read_text().count("hello") == 1  # committed: never written again
    lines = ot.read_side(side)
    assert sum(1 for line in lines if line["kind"] == "lookup") == 1
    # the model was asked once per turn across both processes: the recovery asked only turn 2
    assert sorted(line["turn"] for line in lines if line["kind"] == "model") == [0, 1, 2]
    recovered = [line for line in lines if line["pid"] not in first_pid]
    assert [(line["kind"], line.get("turn")) for line in recovered] == [("model", 2)]
    verified = cli("verify", job_id, "--db", store_url, "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["ok"] is True
    pack = tmp_path / "pack"
    exported = cli("pack", "export", job_id, str(pack), "--db", store_url)
    assert exported.returncode == 0, exported.stderr
    code, receipt, details = assay_verify(pack, tmp_path / "assay-out")
    assert (receipt.get("verdict"), code) == ("MATCH", 0), details or receipt
    ours = cli("pack", "verify", str(pack), "--out-dir", str(tmp_path / "ours"), "--json")
    assert ours.returncode == 0 and json.loads(ours.stdout)["verdict"] == "MATCH", ours.stdout


def test_a_ledger_tool_caught_in_flight_is_reconciled(
    store_url: str, side: Path, tmp_path: Path
) -> None:
    """Killed between the file write and its record: the recovery asks the tool's reconcile
    hook, finds the write, and records it — the file holds one line."""
    out = tmp_path / "out.txt"
    with Runtime(store_url, tools=registry()) as rt:
        job_id = rt.submit("oai_support", {"prompt": f"write hello to {out}"}).job_id
    env = {"OAI_SIDE": str(side)}
    killed = worker(store_url, {**env, "AFFIDAVIT_CRASH_AT": "tool.after_execute:2"})
    assert killed.returncode == -9, killed.stderr
    assert out.read_text().count("hello") == 1  # the effect happened, its record did not
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "completed", shown
    assert out.read_text().count("hello") == 1  # reconciled, never written again
    models = [line["turn"] for line in ot.read_side(side) if line["kind"] == "model"]
    assert sorted(models) == [0, 1, 2]
    with Runtime(store_url, tools=registry()) as rt:
        assert affidavit.verify_job(rt.store, job_id).ok


def test_a_plain_function_tool_caught_in_flight_parks(
    store_url: str, side: Path, tmp_path: Path
) -> None:
    """An SDK function tool has no reconcile hook: caught between its effect and its record it
    gets the job's in-flight policy (park), and is not run again."""
    out = tmp_path / "out.txt"
    with Runtime(store_url, tools=registry()) as rt:
        job_id = rt.submit("oai_support", {"prompt": f"write hello to {out}"}).job_id
    env = {"OAI_SIDE": str(side)}
    killed = worker(store_url, {**env, "AFFIDAVIT_CRASH_AT": "tool.after_execute:1"})
    assert killed.returncode == -9, killed.stderr
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "parked", shown
    assert sum(1 for line in ot.read_side(side) if line["kind"] == "lookup") == 1
    assert not out.exists()


def test_needs_approval_waits_for_an_approval_by_another_principal(
    store_url: str, side: Path
) -> None:
    with Runtime(store_url, tools=registry()) as rt:
        job_id = rt.submit("oai_support", {"prompt": "mail ops@example.com"}).job_id
    env = {"OAI_SIDE": str(side)}
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "waiting", shown
    assert not [line for line in ot.read_side(side) if line["kind"] == "mail"]
    with Runtime(store_url, tools=registry()) as rt:
        [waiting] = [e.payload for e in rt.store.list_events(job_id) if e.type == "job_waiting"]
    assert waiting["wait_type"] == "approval"
    assert waiting["call"]["tool_name"] == "openai_agents.call_tool_approved"
    assert waiting["call"]["args"] == {
        "tool": "send_mail",
        "args": {"to": "ops@example.com"},
        "call_id": "call-mail",
    }
    key = waiting["correlation_key"]
    signalled = cli("signal", job_id, "--key", key, "--payload", '{"approved": true}',
                    "--as", "ann", "--db", store_url)  # fmt: skip
    assert signalled.returncode == 0, signalled.stderr
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "completed", shown
    assert [m["to"] for m in ot.read_side(side) if m["kind"] == "mail"] == ["ops@example.com"]
    models = [line["turn"] for line in ot.read_side(side) if line["kind"] == "model"]
    assert models == [0, 1]  # the recovery after the approval did not ask turn 0 again
    with Runtime(store_url, tools=registry()) as rt:
        assert rt.store.get_job(job_id).output == {"output": "mailed: ['sent to ops@example.com']"}
        assert affidavit.verify_job(rt.store, job_id).ok


def test_a_denied_call_fails_the_job_and_never_runs(store_url: str, side: Path) -> None:
    with Runtime(store_url, tools=registry()) as rt:
        job_id = rt.submit("oai_support", {"prompt": "mail ops@example.com"}).job_id
        assert rt.run_job(job_id).status == "waiting"
        [waiting] = [e.payload for e in rt.store.list_events(job_id) if e.type == "job_waiting"]
        key = waiting["correlation_key"]
        rt.signal(job_id, key, {"approved": False}, approver="ann")
        assert rt.run_job(job_id).status == "failed"
    assert not [line for line in ot.read_side(side) if line["kind"] == "mail"]


def test_a_tripped_guardrail_fails_the_job_before_the_model_is_asked(
    store_url: str, side: Path
) -> None:
    with Runtime(store_url, tools=registry()) as rt:
        job_id = rt.submit("oai_support", {"prompt": "guarded forbidden words"}).job_id
        done = rt.run_job(job_id)
        assert done.status == "failed", done
        assert done.error is not None and "InputGuardrailTripwireTriggered" in json.dumps(
            done.error
        )
        calls = step_calls(rt, job_id)
        assert [c["tool_name"] for c in calls] == ["openai_agents.guardrail"]
        assert affidavit.verify_job(rt.store, job_id).ok
    assert [line["kind"] for line in ot.read_side(side)] == ["guardrail"]


def test_the_budget_counts_each_responses_tokens(store_url: str, tmp_path: Path) -> None:
    """Each response spends 500 tokens: with a budget of 900 the second response passes it and
    the next call — the file write — does not run (the job parks)."""
    name = f"oai_budget_{tmp_path.name[-12:]}"

    async def fn(ctx: affidavit.AgentContext, prompt: str) -> Any:
        result = await AffidavitRunner.run(ot.agent, prompt, run_config=ot.QUIET)
        return result.final_output

    job_agent = affidavit.agent(name, version="1", budget=affidavit.Budget(model_tokens=900))(fn)
    out = tmp_path / "out.txt"
    with Runtime(store_url, tools=ToolRegistry([*STEPS, ot.write_file, job_agent])) as rt:
        job_id = rt.submit(name, {"prompt": f"write hi to {out}"}).job_id
        assert rt.run_job(job_id).status == "parked"
        events = rt.store.list_events(job_id)
        [parked] = [e.payload for e in events if e.type == "job_parked"]
        assert parked["reason"] == "budget_exceeded"
        assert parked["detail"]["spent"]["model_tokens"] == 1000
        assert affidavit.verify_job(rt.store, job_id).ok
    assert not out.exists()


def test_outside_a_job_and_with_unrecordable_parts_it_refuses() -> None:
    import asyncio

    from agents import Agent, ShellTool

    with pytest.raises(ConfigError, match="outside an affidavit agent job"):
        asyncio.run(AffidavitRunner.run(ot.agent, "hi"))
    with pytest.raises(ConfigError, match=r"@affidavit\.tool"):
        ledger_tool(ot.lookup)  # type: ignore[arg-type]

    class FakeCtx:
        job_id = "job"

    shell = Agent(name="sh", tools=[ShellTool(executor=lambda request: "")])
    with pytest.raises(ConfigError, match="local tools"):
        asyncio.run(AffidavitRunner.run(shell, "hi", ctx=FakeCtx()))  # type: ignore[arg-type]


def test_without_the_sdk_the_import_error_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "try:\n    import affidavit.integrations.openai_agents\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip
    assert "pip install 'affidavit[openai-agents]'" in proc.stdout, proc.stdout + proc.stderr


class _Handing(ot.ScriptedModel):
    """The triage agent's model: hands off to billing on its first turn."""

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        from agents import ModelResponse, Usage

        ot.side("triage")
        call = ot._call("transfer_to_billing", {}, "call-handoff")
        return ModelResponse(output=[call], usage=Usage(), response_id=None)


class _Billing(ot.ScriptedModel):
    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        from agents import ModelResponse, Usage

        ot.side("billing", instructions=system_instructions)
        return ModelResponse(output=[ot._say("billing here")], usage=Usage(), response_id=None)


def _handoff_agents() -> Any:
    from agents import Agent

    billing = Agent(name="billing", instructions="Bill.", model=_Billing())
    return Agent(name="triage", instructions="Route.", model=_Handing(), handoffs=[billing])


@affidavit.agent("oai_triage", version="1")
async def _triage(ctx: affidavit.AgentContext, prompt: str) -> Any:
    result = await AffidavitRunner.run(_handoff_agents(), prompt, run_config=ot.QUIET)
    return {"output": result.final_output, "last_agent": result.last_agent.name}


def test_a_handoff_runs_in_the_same_job_with_its_model_recorded(store_url: str, side: Path) -> None:
    with Runtime(store_url, tools=ToolRegistry([*STEPS, _triage])) as rt:
        job_id = rt.submit(_triage, {"prompt": "my bill"}).job_id
        done = rt.run_job(job_id)
        assert done.status == "completed", done.error
        assert done.output == {"output": "billing here", "last_agent": "billing"}
        models = [c for c in step_calls(rt, job_id) if c["kind"] == "pure"]
        assert [c["args"]["turn"] for c in models] == [0, 1]
        assert affidavit.verify_job(rt.store, job_id).ok
    assert [line["kind"] for line in ot.read_side(side)] == ["triage", "billing"]


_INSTRUCTIONS = ["Be brief."]


@affidavit.agent("oai_changing", version="1")
async def _changing(ctx: affidavit.AgentContext, prompt: str) -> Any:
    agent = ot.agent.clone(instructions=_INSTRUCTIONS[0])
    result = await AffidavitRunner.run(agent, prompt, run_config=ot.QUIET)
    return result.final_output


def test_a_recovery_asking_about_another_conversation_parks(store_url: str, side: Path) -> None:
    """The same agent version with other instructions would ask the model about another
    conversation than the one recorded: the job parks as nondeterministic, the model unasked."""
    _INSTRUCTIONS[0] = "Be brief."
    with Runtime(store_url, tools=ToolRegistry([*STEPS, _changing])) as rt:
        job_id = rt.submit(_changing, {"prompt": "mail ops@example.com"}).job_id
        assert rt.run_job(job_id).status == "waiting"
        [waiting] = [e.payload for e in rt.store.list_events(job_id) if e.type == "job_waiting"]
        rt.signal(job_id, waiting["correlation_key"], {"approved": True}, approver="ann")
        _INSTRUCTIONS[0] = "Be verbose."
        done = rt.run_job(job_id)
        assert done.status == "parked", done
        [parked] = [e.payload for e in rt.store.list_events(job_id) if e.type == "job_parked"]
        assert parked["reason"] == "nondeterministic", parked
    assert [line["turn"] for line in ot.read_side(side) if line["kind"] == "model"] == [0]
    assert not [line for line in ot.read_side(side) if line["kind"] == "mail"]


def test_calls_of_one_turn_are_steps_in_the_order_the_model_asked(
    store_url: str, side: Path
) -> None:
    with Runtime(store_url, tools=registry()) as rt:
        job_id = rt.submit("oai_support", {"prompt": "two a b"}).job_id
        done = rt.run_job(job_id)
        assert done.status == "completed", done.error
        tools = [c["args"]["call_id"] for c in step_calls(rt, job_id) if c["kind"] == "tool"]
        assert tools == ["call-a", "call-b"]
        assert affidavit.verify_job(rt.store, job_id).ok
    assert [line["q"] for line in ot.read_side(side) if line["kind"] == "lookup"] == ["a", "b"]


class _FilesModel(ot.ScriptedModel):
    """Asks the MCP server's ``write_file`` once, then answers."""

    def __init__(self, out: Path) -> None:
        self.out = out

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        from agents import ModelResponse, Usage

        items = [] if isinstance(input, str) else [ot._item(i) for i in input]
        if not any(i.get("type") == "function_call_output" for i in items):
            args = {"path": str(self.out), "text": "via mcp"}
            out: Any = ot._call("write_file", args, "m-1")
        else:
            out = ot._say("written")
        return ModelResponse(output=[out], usage=Usage(), response_id=None)


def test_an_mcp_servers_tools_go_through_the_ledger_with_the_key_in_meta(
    store_url: str, tmp_path: Path
) -> None:
    """The SDK's own MCPServerStdio (a real MCP server subprocess) on the agent: each
    tools/call is one tool step of the ledger, made once, carrying the step's external key in
    ``_meta``."""
    from agents import Agent
    from agents.mcp import MCPServerStdio

    out, files_side = tmp_path / "mcp-out.txt", tmp_path / "files-side.jsonl"
    server_py = Path(__file__).with_name("mcp_files_server.py")
    name = f"oai_mcp_{tmp_path.name[-12:]}"

    async def fn(ctx: affidavit.AgentContext, prompt: str) -> Any:
        params = {"command": sys.executable, "args": [str(server_py)],
                  "env": {"FILES_SIDE": str(files_side)}}  # fmt: skip
        async with MCPServerStdio(params=params, cache_tools_list=True) as server:  # type: ignore[arg-type]
            agent = Agent(name="files", model=_FilesModel(out), mcp_servers=[server])
            result = await AffidavitRunner.run(agent, prompt, run_config=ot.QUIET)
        return result.final_output

    job_agent = affidavit.agent(name, version="1")(fn)
    with Runtime(store_url, tools=ToolRegistry([*STEPS, job_agent])) as rt:
        job_id = rt.submit(name, {"prompt": "save it"}).job_id
        done = rt.run_job(job_id)
        assert done.status == "completed", done.error
        assert done.output == "written"
        [tool] = [c for c in step_calls(rt, job_id) if c["kind"] == "tool"]
        assert (tool["tool_name"], tool["args"]["tool"]) == (
            "openai_agents.call_tool",
            "write_file",
        )
        [started] = [
            e.payload for e in rt.store.list_events(job_id) if e.type == "tool_invocation_started"
        ]
        assert affidavit.verify_job(rt.store, job_id).ok
    assert out.read_text().splitlines() == ["via mcp"]
    [write] = [json.loads(x) for x in files_side.read_text().splitlines()]
    assert write["job"] == job_id
    assert write["key"].startswith(f"affidavit:{job_id}:{started['step_id']}:")
