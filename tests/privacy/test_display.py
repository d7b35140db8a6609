"""The readers that show a subject's job to people: the "what to do next" park hint and the MCP
server's job tools open its sealed values while its key exists and show them erased after —
never the stored envelope. On both backends; MCP over a real stdio session."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from affidavit import AgentContext, Runtime, ToolRegistry
from affidavit.cli.next_steps import decisions_doc, next_steps
from affidavit.core.privacy import ERASED, is_sealed
from affidavit.faces.auth import create_api_key
from affidavit.privacy import erase
from affidavit.runtime._agent import Agent
from tests.privacy import subject_tools as st


def _agents(ctx: AgentContext, email: str, first: bool) -> Any:
    if first:
        ctx.call(st.send_email, to=email, body="hi")
    else:  # another tool at call 0: the job parks as nondeterministic
        ctx.call(st.fail, who=email)
    ctx.wait("go")
    return "done"


def test_a_park_hint_shows_a_subjects_detail_opened(store_url: str, master_key: Path) -> None:
    v1 = Agent("pv_drift", lambda ctx, email: _agents(ctx, email, True), "1")
    with Runtime(
        store_url, tools=ToolRegistry([st.send_email, st.fail, v1]), master_key=master_key
    ) as rt:
        job_id = rt.submit(v1, {"email": st.CANARY}, subject="customer-7").job_id
        assert rt.run_job(job_id).status == "waiting"
        rt.signal(job_id, "go", {})
    v2 = Agent("pv_drift", lambda ctx, email: _agents(ctx, email, False), "1")
    with Runtime(
        store_url, tools=ToolRegistry([st.send_email, st.fail, v2]), master_key=master_key
    ) as rt:
        assert rt.run_job(job_id).status == "parked"
        stored = [e for e in rt.store.list_events(job_id) if e.type == "job_parked"][-1]
        assert is_sealed(stored.payload["detail"])  # (what the record holds)
        doc = decisions_doc(rt.store, rt.get_job(job_id))
        detail = doc["parked"]["detail"]
        assert not is_sealed(detail) and detail["called"]["tool_name"] == "pv_fail"
        [line] = next_steps({"job_id": job_id, "status": "parked", **doc})
        assert "--decision" in line


def _mcp_get(env: dict[str, str], tool: str, args: dict[str, Any]) -> Any:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "affidavit", "mcp"], env={**os.environ, **env}
    )

    async def go() -> Any:
        async with Client(params) as client:
            result = await client.call_tool(tool, args)
        assert not result.is_error, result
        return result.structured_content

    return anyio.run(go)


def test_mcp_job_tools_show_a_subjects_output_opened_then_erased(
    store_url: str, master_key: Path
) -> None:
    with Runtime(store_url, tools=st.registry(), master_key=master_key) as rt:
        job = rt.submit("pv_simple", {"email": st.CANARY}, subject="customer-7")
        assert rt.run_job(job.job_id).status == "completed"
        raw = rt.store.get_job(job.job_id).output
        assert is_sealed(raw)
        _, key = create_api_key(rt.store, agent_id="watcher", role="observer", namespace="default")
        env = {
            "AFFIDAVIT_DATABASE_URL": store_url,
            "AFFIDAVIT_MASTER_KEY": str(master_key),
            "AFFIDAVIT_API_KEY": key,
        }
        got = _mcp_get(env, "get_job", {"job_id": job.job_id})
        assert got["output"] == st.CANARY
        listed = _mcp_get(env, "list_jobs", {})
        assert [j["output"] for j in listed["jobs"]] == [st.CANARY]
        erase(rt.store, "customer-7", sealer=rt.sealer)
        for doc in (
            _mcp_get(env, "get_job", {"job_id": job.job_id}),
            _mcp_get(env, "list_jobs", {})["jobs"][0],
        ):
            assert doc["output"] == ERASED
            text = json.dumps(doc)
            assert st.CANARY not in text and json.dumps(raw)[1:40] not in text
