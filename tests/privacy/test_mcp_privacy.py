"""``affidavit mcp``'s answers about a subject's job (a real subprocess over stdio and HTTP, on
both backends): ``signal`` and ``approve`` show its values opened while the subject's key
exists, and never its plaintext once the subject is erased — also from a long-lived server
that wrote the job before the erasure (and so once held its key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.core.privacy import ERASED, is_sealed
from affidavit.faces.auth import create_api_key
from affidavit.privacy import erase
from affidavit.store import open_store
from tests.integrations.test_mcp_server import TRANSPORTS, World, _free_port, _wait_http, call
from tests.privacy import subject_tools as st

SUBJECT = "customer-7"


@pytest.fixture
def world(store_url: str, master_key: Path, tmp_path: Path) -> Iterator[World]:
    """A subject's ``pv_everything`` job waiting for its signal ``details``, keys, and an
    ``affidavit mcp`` HTTP server with the master key."""
    key_file = Path(os.environ["AFFIDAVIT_SIGNING_KEY"])
    store = open_store(store_url)
    keys = {}
    for name, agent, role in [("agent_a", "bot-a", "agent"), ("approver_a", "judge-a", "approver")]:
        _, keys[name] = create_api_key(store, agent_id=agent, role=role, namespace="a")
    store.close()
    with Runtime(store_url, tools=st.registry(), master_key=master_key) as rt:
        job = rt.submit("pv_everything", {"email": st.CANARY}, subject=SUBJECT, namespace="a")
        assert rt.run_job(job.job_id).status == "waiting"
    env = {
        "AFFIDAVIT_SIGNING_KEY": str(key_file),
        "AFFIDAVIT_DATABASE_URL": store_url,
        "AFFIDAVIT_MASTER_KEY": str(master_key),
    }
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "affidavit", "mcp", "--transport", "http", "--port", str(port)],
        env={**os.environ, **env},
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc)
        url = f"http://127.0.0.1:{port}/mcp"
        yield World(store_url, keys, key_file, job.job_id, job.job_id, env, url)
    finally:
        proc.terminate()
        proc.wait(10)


def _run(world: World, master_key: Path) -> str:
    with Runtime(world.db_url, tools=st.registry(), master_key=master_key) as rt:
        return rt.run_job(world.job_a).status


def _text(answer: Any) -> str:
    return json.dumps(answer, ensure_ascii=False)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_signal_and_approve_answers_open_a_subjects_values_then_show_them_erased(
    world: World, master_key: Path, transport: str
) -> None:
    job_id, note = world.job_a, {"note": f"call {st.CANARY}"}
    signalled = call(world, transport, "agent_a", "signal", job_id=job_id, key="details",
                     payload=note)  # fmt: skip
    assert signalled["appended"] is True, signalled
    assert _run(world, master_key) == "waiting"  # now for the approval
    approved = call(world, transport, "approver_a", "approve", job_id=job_id,
                    key="send_summary", approved=True, comment=f"ok {st.CANARY}")  # fmt: skip
    assert approved["appended"] is True, approved
    assert _run(world, master_key) == "completed"
    # the job's output, in the answers to a repeated signal and decision: opened
    again = call(world, transport, "agent_a", "signal", job_id=job_id, key="details",
                 payload=note)  # fmt: skip
    assert again["appended"] is False and not is_sealed(again["output"]), again
    assert again["output"]["sent"] == st.CANARY and again["output"]["got"] == note
    decided = call(world, transport, "approver_a", "approve", job_id=job_id,
                   key="send_summary", approved=True)  # fmt: skip
    assert decided["appended"] is False and decided["output"]["sent"] == st.CANARY, decided

    with Runtime(world.db_url, tools=st.registry(), master_key=master_key) as rt:
        erase(rt.store, SUBJECT, sealer=rt.sealer)
    # after the erasure (the HTTP server wrote the job, and kept its data key in memory):
    # never the plaintext, whatever the answer
    for tool, who, args in [
        ("signal", "agent_a", {"key": "details", "payload": note}),
        ("approve", "approver_a", {"key": "send_summary", "approved": True}),
    ]:
        answer = call(world, transport, who, tool, job_id=job_id, **args)
        assert st.CANARY not in _text(answer), (tool, answer)
        if transport == "http":  # it holds the job's key: the job, shown erased
            assert answer["appended"] is False and answer["output"] == ERASED, answer
        else:  # a new process: the erased job's record takes no more writes
            assert answer == ("error", "subject_error"), answer
