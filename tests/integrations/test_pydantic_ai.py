"""A Pydantic AI agent (the real library, a scripted ``FunctionModel``) run as an affidavit agent
job on both backends: every model request a recorded pure step, every tool call a tool step
through the ledger; killed between a file write and its record, recovered by another worker
process with the file written once and the model not asked again for a recorded turn; an
approval of a deferred tool call from the CLI resumes the job."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

import affidavit
from affidavit import ConfigError, Runtime, ToolRegistry
from affidavit.integrations.pydantic_ai import RECORD_FORMAT, AffidavitAgent, AffidavitDurability
from tests.integrations import pydai_tools as pt
from tests.packs.helpers import assay_verify

TOOLS = Path(pt.__file__)
SRC = str(Path(affidavit.__file__).resolve().parents[1])


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "200", **(env or {})}
    full.pop("AFFIDAVIT_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=180,
        check=False,
    )


@pytest.fixture
def side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "side.jsonl"
    monkeypatch.setenv("PYDAI_SIDE", str(path))
    return path


@pytest.fixture
def rt(store_url: str) -> Any:
    with Runtime(store_url, tools=ToolRegistry(pt.support.registrations)) as runtime:
        yield runtime


def step_calls(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in rt.store.list_events(job_id) if e.type == "step_called"]


def submit(
    url: str, tools: Path, job_input: dict[str, Any], env: dict[str, str], agent: str = "support"
) -> str:
    """Submit an agent job from another process that loads ``tools`` (its agent's version)."""
    code = (
        "import json, sys\n"
        "from affidavit import Runtime, load_tools\n"
        "load_tools(sys.argv[1])\n"
        "with Runtime(sys.argv[2]) as rt:\n"
        "    print(rt.submit(sys.argv[4], json.loads(sys.argv[3])).job_id)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tools), url, json.dumps(job_input), agent],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": SRC, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def worker(url: str, env: dict[str, str], tools: Path = TOOLS) -> subprocess.CompletedProcess[str]:
    """``affidavit worker --until-idle`` with the agent's tools file, a short lease."""
    return cli("worker", "--tools", str(tools), "--until-idle", "--lease-seconds", "1",
               "--db", url, env=env)  # fmt: skip


def run_until_done(
    url: str, job_id: str, env: dict[str, str], tools: Path = TOOLS
) -> dict[str, Any]:
    """Workers (subprocesses) until the job ends or waits: a dead worker's lease must expire
    before another can take the job, so this polls, bounded."""
    deadline = time.monotonic() + 120
    while True:
        ran = worker(url, env, tools)
        assert ran.returncode == 0, ran.stderr
        shown = json.loads(cli("jobs", "show", job_id, "--db", url, "--json").stdout)
        if shown["status"] not in ("pending", "running") or time.monotonic() > deadline:
            return dict(shown)
        time.sleep(0.2)


def test_steps_recorded_once_each(rt: Runtime, side: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job = rt.submit("support", {"prompt": f"write hello to {out}"})
    done = rt.run_job(job.job_id)
    assert done.status == "completed", done.error
    assert done.output == {"output": f"wrote 'hello' to {out}"}
    calls = step_calls(rt, job.job_id)
    assert [(c["kind"], c["tool_name"]) for c in calls] == [
        ("pure", "support.model_request"),
        ("tool", "support.tool.lookup"),
        ("pure", "support.model_request"),
        ("tool", "pydai_write_file"),
        ("pure", "support.model_request"),
    ]
    assert calls[1]["args"] == {"q": "hello"}  # the tool's own arguments
    assert calls[3]["args"] == {"path": str(out), "text": "hello"}
    assert [c["args"]["turn"] for c in calls if c["kind"] == "pure"] == [0, 1, 2]
    # the model's answers are the recorded outputs, as ModelMessagesTypeAdapter JSON
    finished = {
        e.payload["node_id"]: e.payload
        for e in rt.store.list_events(job.job_id)
        if e.type == "node_finished"
    }
    first = finished["#0"]["output"]
    assert first["kind"] == "response" and first["parts"][0]["tool_name"] == "lookup"
    assert out.read_text().count("hello") == 1
    assert [line["kind"] for line in pt.read_side(side)] == ["model", "lookup", "model", "model"]
    assert affidavit.verify_job(rt.store, job.job_id).ok


def test_killed_after_the_write_recovers_on_another_worker_once(
    store_url: str, side: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    with Runtime(store_url, tools=ToolRegistry(pt.support.registrations)) as rt:
        job_id = rt.submit("support", {"prompt": f"write hello to {out}"}).job_id
    env = {"PYDAI_SIDE": str(side)}
    # the second tool execution is the file write: killed after it, before its record
    killed = worker(store_url, {**env, "AFFIDAVIT_CRASH_AT": "tool.after_execute:2"})
    assert killed.returncode == -9, killed.stderr
    assert out.read_text().count("hello") == 1  # the effect happened, its record did not
    first_pid = {line["pid"] for line in pt.read_side(side)}
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "completed", shown
    assert out.read_text().count("hello") == 1  # reconciled, never written again
    lines = pt.read_side(side)
    # the model was asked once per turn across both processes: the recovery asked only turn 2
    assert sorted(line["turn"] for line in lines if line["kind"] == "model") == [0, 1, 2]
    recovered = [line for line in lines if line["pid"] not in first_pid]
    assert [(line["kind"], line.get("turn")) for line in recovered] == [("model", 2)]
    assert sum(1 for line in lines if line["kind"] == "lookup") == 1
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


def test_plain_tool_caught_in_flight_parks(store_url: str, side: Path, tmp_path: Path) -> None:
    """A tool without a reconcile hook caught between its effect and its record gets the
    agent's in-flight policy (park): it is not run again on recovery."""
    out = tmp_path / "out.txt"
    with Runtime(store_url, tools=ToolRegistry(pt.support.registrations)) as rt:
        job_id = rt.submit("support", {"prompt": f"write hello to {out}"}).job_id
    env = {"PYDAI_SIDE": str(side)}
    killed = worker(store_url, {**env, "AFFIDAVIT_CRASH_AT": "tool.after_execute:1"})
    assert killed.returncode == -9, killed.stderr
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "parked", shown
    assert sum(1 for line in pt.read_side(side) if line["kind"] == "lookup") == 1
    assert not out.exists()
    # the park, the trace and the step name the real tool, with its own arguments
    with Runtime(store_url, tools=ToolRegistry(pt.support.registrations)) as rt:
        events = rt.store.list_events(job_id)
    [parked] = [e.payload for e in events if e.type == "job_parked"]
    assert parked["detail"]["tool_name"] == "support.tool.lookup"
    [called] = [
        e.payload for e in events if e.type == "step_called" and e.payload["kind"] == "tool"
    ]
    assert (called["tool_name"], called["args"]) == ("support.tool.lookup", {"q": "hello"})
    trace = cli("jobs", "trace", job_id, "--db", store_url)
    assert "support.tool.lookup" in trace.stdout and "call_tool" not in trace.stdout, trace.stdout


def test_approval_from_the_cli_resumes_the_job(store_url: str, side: Path) -> None:
    with Runtime(store_url, tools=ToolRegistry(pt.support.registrations)) as rt:
        job_id = rt.submit("support", {"prompt": "mail ops@example.com"}).job_id
    env = {"PYDAI_SIDE": str(side)}
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "waiting", shown
    assert not [line for line in pt.read_side(side) if line["kind"] == "mail"]
    key = "approve:send_mail:call-mail"
    with Runtime(store_url, tools=ToolRegistry(pt.support.registrations)) as rt:
        approval = [c for c in step_calls(rt, job_id) if c["kind"] == "approval"]
    # the person approves this call with these exact arguments
    assert approval[0]["args"] == {
        "key": key,
        "payload": {
            "agent": "support",
            "tool": "send_mail",
            "args": {"to": "ops@example.com"},
            "tool_call_id": "call-mail",
        },
    }
    signalled = cli("signal", job_id, "--key", key, "--payload", '{"approved": true}',
                    "--as", "ann", "--db", store_url)  # fmt: skip
    assert signalled.returncode == 0, signalled.stderr
    shown = run_until_done(store_url, job_id, env)
    assert shown["status"] == "completed", shown
    mails = [line for line in pt.read_side(side) if line["kind"] == "mail"]
    assert [m["to"] for m in mails] == ["ops@example.com"]
    models = [line["turn"] for line in pt.read_side(side) if line["kind"] == "model"]
    assert models == [0, 1]  # the recovery after the approval did not ask turn 0 again
    with Runtime(store_url, tools=ToolRegistry(pt.support.registrations)) as rt:
        assert rt.store.get_job(job_id).output == {"output": "mailed: ['sent to ops@example.com']"}
        assert affidavit.verify_job(rt.store, job_id).ok


def test_a_denied_call_fails_the_job_and_never_runs(store_url: str, side: Path) -> None:
    with Runtime(store_url, tools=ToolRegistry(pt.support.registrations)) as rt:
        job_id = rt.submit("support", {"prompt": "mail ops@example.com"}).job_id
        assert rt.run_job(job_id).status == "waiting"
        rt.signal(job_id, "approve:send_mail:call-mail", {"approved": False}, approver="ann")
        assert rt.run_job(job_id).status == "failed"
    assert not [line for line in pt.read_side(side) if line["kind"] == "mail"]


def test_bad_construction_is_refused() -> None:
    with pytest.raises(Exception, match="needs to have a unique `name`"):
        Agent(TestModel(), capabilities=[AffidavitDurability()])
    with pytest.raises(ConfigError, match=r"@affidavit\.tool"):
        AffidavitDurability(tools=[pt.lookup])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="in_flight"):
        AffidavitDurability(in_flight="retry")
    durability = AffidavitDurability()
    Agent(TestModel(), name="pydai_once", capabilities=[durability])
    with pytest.raises(ConfigError, match="registers agent 'pydai_once'"):
        Agent(TestModel(), name="pydai_twice", capabilities=[durability])
    with pytest.warns(DeprecationWarning), pytest.raises(Exception, match="needs a name"):
        AffidavitAgent(Agent(TestModel()))
    with pytest.warns(DeprecationWarning), pytest.raises(Exception, match="needs a model"):
        AffidavitAgent(Agent(name="modelless"), name="modelless")


def test_outside_a_job_the_agent_runs_as_without_the_capability() -> None:
    """Not in a job, the agent (and the deprecated wrapper) runs as Pydantic AI does (not
    durable)."""
    seen: list[int] = []
    plain = Agent(TestModel(), name="pydai_plain", capabilities=[AffidavitDurability()])

    @plain.tool_plain
    def count(n: int) -> int:
        seen.append(n)
        return n

    assert plain.run_sync("hi").output == '{"count":0}'
    assert seen == [0]  # TestModel calls each tool once with generated arguments
    bare = Agent(TestModel())
    bare.tool_plain(count)
    with pytest.warns(DeprecationWarning, match="AffidavitDurability"):
        wrapper = AffidavitAgent(bare, name="pydai_plain_wrapped", version="1")
    assert wrapper.run_sync("hi").output == '{"count":0}'
    assert seen == [0, 0]


def test_without_pydantic_ai_the_import_error_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['pydantic_ai'] = None\n"
        "try:\n    import affidavit.integrations.pydantic_ai\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip
    assert "pip install 'affidavit[pydantic-ai]'" in proc.stdout, proc.stdout + proc.stderr


def test_the_default_version_is_the_record_format_and_the_code_is_the_users() -> None:
    """Not a hash of the source: edited code of the same wrapper format continues a job that
    it reproduces; the source recorded for information is the module constructing it."""
    assert pt.support.job.version == RECORD_FORMAT
    assert pt.support.job.code_sha256 == hashlib.sha256(TOOLS.read_bytes()).hexdigest()


def test_a_recovery_asking_about_another_conversation_parks(
    store_url: str, side: Path, tmp_path: Path
) -> None:
    """The same agent version with other instructions would ask the model about another
    conversation than the one recorded: the job parks as nondeterministic, the model unasked."""
    source = TOOLS.read_text()
    pinned = source.replace(
        "AffidavitDurability(tools=", 'AffidavitDurability(version="pinned", tools='
    )
    assert pinned != source
    before, after = tmp_path / "before" / "support.py", tmp_path / "after" / "support.py"
    for path, text in ((before, pinned), (after, pinned.replace("Be brief.", "Be verbose."))):
        path.parent.mkdir()
        path.write_text(text)
    env = {"PYDAI_SIDE": str(side)}
    job_id = submit(store_url, before, {"prompt": "mail ops@example.com"}, env)
    ran = cli("worker", "--tools", str(before), "--until-idle", "--db", store_url, env=env)
    assert ran.returncode == 0, ran.stderr
    key = "approve:send_mail:call-mail"
    assert cli("signal", job_id, "--key", key, "--payload", '{"approved": true}',
               "--as", "ann", "--db", store_url).returncode == 0  # fmt: skip
    ran = cli("worker", "--tools", str(after), "--until-idle", "--db", store_url, env=env)
    assert ran.returncode == 0, ran.stderr
    shown = json.loads(cli("jobs", "show", job_id, "--db", store_url, "--json").stdout)
    assert shown["status"] == "parked", shown
    assert "nondeterministic" in json.dumps(shown), shown
    assert [line["turn"] for line in pt.read_side(side) if line["kind"] == "model"] == [0]
    assert not [line for line in pt.read_side(side) if line["kind"] == "mail"]


def test_approval_over_the_http_api_names_the_call_and_resumes(store_url: str, side: Path) -> None:
    """The API's decision context shows the person the exact call (tool and arguments); an
    approval signalled over HTTP lets any worker continue the job."""
    from affidavit.api.app import create_app
    from affidavit.faces.ratelimit import RateLimit
    from affidavit.store import open_store
    from tests.api.conftest import Server, make_keys

    tools = ToolRegistry(pt.support.registrations)
    store = open_store(store_url)
    keys = make_keys(store)
    app = create_app(store, tools=tools, rate_limit=RateLimit(100_000, 1))
    try:
        with Server(app) as url, Runtime(store_url, tools=tools) as rt:
            job_id = rt.submit("support", {"prompt": "mail ops@example.com"}, namespace="a").job_id
            assert rt.run_job(job_id).status == "waiting"
            headers = {"Authorization": keys["approver_a"]}
            with httpx.Client(base_url=url, headers=headers, timeout=30) as c:
                [wait] = c.get(f"/api/jobs/{job_id}/decisions").json()["waits"]
                assert wait["wait_type"] == "approval"
                assert wait["correlation_key"] == "approve:send_mail:call-mail"
                assert wait["payload"]["tool"] == "send_mail"
                assert wait["payload"]["args"] == {"to": "ops@example.com"}
                body = {"key": wait["correlation_key"], "payload": {"approved": True}}
                signalled = c.post(f"/api/jobs/{job_id}/signal", json=body)
                assert signalled.status_code == 200, signalled.text
            done = rt.run_job(job_id)
            assert done.status == "completed", done.error
            assert done.output == {"output": "mailed: ['sent to ops@example.com']"}
    finally:
        store.close()
    assert [line["to"] for line in pt.read_side(side) if line["kind"] == "mail"] == [
        "ops@example.com"
    ]


def test_affidavit_run_with_the_agent_prints_its_output(
    store_url: str, side: Path, tmp_path: Path
) -> None:
    """``affidavit run --agent support --tools FILE --input '{"prompt": ...}'``: the job's output
    holds the agent's."""
    out = tmp_path / "out.txt"
    ran = cli("run", "--agent", "support", "--tools", str(TOOLS),
              "--input", json.dumps({"prompt": f"write hi to {out}"}),
              "--db", store_url, "--json", env={"PYDAI_SIDE": str(side)})  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    shown = json.loads(ran.stdout)
    assert shown["status"] == "completed", shown
    assert shown["output"] == {"output": f"wrote 'hi' to {out}"}
    assert out.read_text().splitlines()[0].startswith("hi ")


def test_model_usage_is_recorded_the_model_limit_granted_and_the_budget_holds(
    store_url: str, tmp_path: Path
) -> None:
    """Each model response's token usage is recorded with its step and counted by the job's
    budget; ``model_limit`` gives each model request a grant of the model's limit."""
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        usage = RequestUsage(input_tokens=300, output_tokens=200)
        if turn < 5:
            call = ToolCallPart("bump", {"n": turn}, tool_call_id=f"c-{turn}")
            return ModelResponse(parts=[call], usage=usage)
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    fn_model = FunctionModel(model)
    name = f"pydai_budget_{tmp_path.name[-12:]}"
    wrapper = AffidavitDurability(
        version="1",
        model_limit=affidavit.Limit(concurrency=1),
        budget=affidavit.Budget(model_tokens=1200),
    )
    agent = Agent(fn_model, name=name, capabilities=[wrapper])

    @agent.tool_plain
    def bump(n: int) -> int:
        return n + 1

    with Runtime(store_url, tools=ToolRegistry(wrapper.registrations)) as rt:
        job_id = rt.submit(name, {"prompt": "go"}).job_id
        assert rt.run_job(job_id).status == "parked"
        events = rt.store.list_events(job_id)
        models = [
            e.payload
            for e in events
            if e.type == "node_finished" and e.payload.get("limit_grant") is not None
        ]
        # three responses of 500 tokens: the third passes 1,200, the next call does not run
        assert [m["usage"] for m in models] == [{"tokens": 500}] * 3
        assert {m["limit_grant"]["limit"] for m in models} == {f"model:{fn_model.model_name}"}
        [parked] = [e.payload for e in events if e.type == "job_parked"]
        assert parked["reason"] == "budget_exceeded"
        assert parked["detail"]["spent"]["model_tokens"] == 1500
        assert affidavit.verify_job(rt.store, job_id).ok
