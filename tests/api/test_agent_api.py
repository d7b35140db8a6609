"""``POST /api/jobs`` with ``"agent": NAME`` over real HTTP on both backends: the job is
recorded with the agent's identity, runs on a worker, is signalled through the API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from affidavit import Runtime
from affidavit.api.app import create_app
from affidavit.store import open_store
from tests.api.conftest import Api, Server, make_keys
from tests.runtime import agent_tools as at


@pytest.fixture
def agent_api(db_url: str) -> Iterator[Api]:
    store = open_store(db_url)
    tools = at.registry()
    app = create_app(store, tools=tools)
    with Server(app) as url, Runtime(db_url, tools=tools) as rt:
        yield Api(url, store, rt, make_keys(store))
    store.close()


def test_submit_an_agent_job_over_http(agent_api: Api) -> None:
    body = {"agent": "refund_agent", "input": {"order_id": "BIG-3"}}
    with agent_api.client("agent_a") as c:
        r = c.post("/api/jobs", json=body, headers={"Idempotency-Key": "agent-k"})
        assert r.status_code == 201, r.text
        job_id = r.json()["job_id"]
        again = c.post("/api/jobs", json=body, headers={"Idempotency-Key": "agent-k"})
        assert again.status_code == 200 and again.json()["job_id"] == job_id
        for bad, fragment in [
            ({"agent": "ghost"}, "not registered"),
            ({"agent": "refund_agent", "input": {"x": 1}}, "does not fit"),
            ({"agent": "refund_agent", "plan": {"nodes": []}}, "exactly one"),
        ]:
            refused = c.post("/api/jobs", json=bad)
            assert refused.status_code == 422, refused.text
            assert fragment in refused.text
    events = agent_api.store.list_events(job_id)
    assert [e.type for e in events] == ["job_created", "agent_started"]
    assert events[0].payload["namespace"] == "a"
    assert agent_api.runtime.run_job(job_id).status == "waiting"
    with agent_api.client("approver_a") as c:
        yes = {"key": "big_refund", "payload": {"approved": True}}
        s = c.post(f"/api/jobs/{job_id}/signal", json=yes)
        assert s.status_code == 200, s.text
    done = agent_api.runtime.run_job(job_id)
    assert done.status == "completed" and done.output == {"refunded": 250}
