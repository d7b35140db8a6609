"""``Client.submit`` of an agent job: by the agent's name or by its ``@affidavit.agent`` object
(the server runs the code registered in its own tools), approved by its key, waited for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from affidavit import Runtime
from affidavit.api.app import create_app
from affidavit.store import open_store
from tests.api.conftest import Api, Server, make_keys
from tests.client.helpers import client
from tests.runtime import agent_tools as at


@pytest.fixture
def agent_api(db_url: str) -> Iterator[Api]:
    store = open_store(db_url)
    tools = at.registry()
    with Server(create_app(store, tools=tools)) as url, Runtime(db_url, tools=tools) as rt:
        yield Api(url, store, rt, make_keys(store))
    store.close()


def test_submit_an_agent_by_name_and_by_object(agent_api: Api) -> None:
    with client(agent_api, "agent_a") as c:
        by_name = c.submit("refund_agent", {"order_id": "BIG-1"}, idempotency_key="agent-1")
        by_object = c.submit(at.refund_agent, {"order_id": "BIG-1"}, idempotency_key="agent-1")
        assert by_object == by_name  # the same submission
    [created, started] = agent_api.store.list_events(by_name.job_id)
    assert (created.type, started.type) == ("job_created", "agent_started")
    assert started.payload["agent"] == "refund_agent"
    assert agent_api.runtime.run_job(by_name.job_id).status == "waiting"
    with client(agent_api, "approver_a") as c:
        assert c.wait(by_name.job_id, timeout=60).status == "waiting"
        c.approve(by_name.job_id, "big_refund", comment="ok")
    agent_api.runtime.run_job(by_name.job_id)
    with client(agent_api, "observer_a") as c:
        done = c.wait(by_name.job_id, timeout=60)
    assert done.status == "completed" and done.output == {"refunded": 250}
