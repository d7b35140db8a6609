"""Child jobs over real HTTP on both backends: ``GET /api/jobs/{id}`` carries
``parent_job_id`` and ``children``; the list's ``parent`` filter lists a job's children."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from affidavit import Runtime
from affidavit.api.app import create_app
from affidavit.store import open_store
from tests.api.conftest import Api, Server, make_keys
from tests.runtime import child_agents as ca


@pytest.fixture
def child_api(db_url: str) -> Iterator[Api]:
    store = open_store(db_url)
    tools = ca.registry()
    app = create_app(store, tools=tools)
    with Server(app) as url, Runtime(db_url, tools=tools) as rt:
        yield Api(url, store, rt, make_keys(store))
    store.close()


def test_parent_and_children_over_http(child_api: Api) -> None:
    with child_api.client("agent_a") as c:
        r = c.post("/api/jobs", json={"agent": "ch_parent", "input": {"orders": ["A", "B"]}})
        assert r.status_code == 201, r.text
        root = r.json()["job_id"]
        child_api.runtime.run_until_idle()
        shown = c.get(f"/api/jobs/{root}").json()
        assert shown["status"] == "completed" and shown["parent_job_id"] is None
        children = shown["children"]
        assert [o["job_id"] for o in shown["output"]] == children
        child = c.get(f"/api/jobs/{children[0]}").json()
        assert child["parent_job_id"] == root and child["children"] == []
        listed = c.get("/api/jobs", params={"parent": root}).json()["jobs"]
        assert sorted(j["job_id"] for j in listed) == sorted(children)
        assert c.get("/api/jobs", params={"parent": children[0]}).json()["jobs"] == []
        traced = c.get(f"/api/jobs/{root}/trace").json()
        assert traced["parent_job_id"] is None
        assert traced["children"] == [{"job_id": j, "status": "completed"} for j in children]
        leaf = c.get(f"/api/jobs/{children[0]}/trace").json()
        assert leaf["parent_job_id"] == root and leaf["children"] == []
