"""``POST /api/jobs/{id}/fork``: real HTTP on loopback, both backends. A fork of a finished job
reuses its recorded prefix (the ``act`` call of the prefix is not made again) and names its
source; a fork of a job with no seal, or from a step that does not exist, is refused (409) and
writes nothing; only an admin may fork."""

from __future__ import annotations

from typing import Any

from affidavit.store import JobFilter
from affidavit.verify import check_fork, verify_job
from tests.api.conftest import Api
from tests.runtime.helpers import of_type

PLAN: dict[str, Any] = {
    "name": "fork-api",
    "nodes": [
        {"id": "a", "type": "tool", "tool": "act", "args": {"x": "${input.x}"}},
        {"id": "b", "type": "tool", "tool": "act", "args": {"a": "${a}", "x": "${input.x}"},
         "depends_on": ["a"]},
    ],
}  # fmt: skip


def _jobs(api: Api) -> int:
    return len(api.store.list_jobs(JobFilter()))


def test_fork_over_http(api: Api) -> None:
    source = api.runtime.submit(PLAN, {"x": 1}, namespace="a").job_id
    assert api.runtime.run_job(source).status == "completed"
    with api.client("agent_a") as c:
        assert c.post(f"/api/jobs/{source}/fork", json={"from_step": "a"}).status_code == 403
    with api.client("admin") as c:
        r = c.post(f"/api/jobs/{source}/fork", json={"from_step": "a", "input": {"x": 2}})
    assert r.status_code == 201, r.text
    fork = r.json()
    assert fork["forked_from"]["job_id"] == source and fork["forked_from"]["step"] == "a"
    assert api.runtime.run_job(fork["job_id"]).status == "completed"
    events = api.store.list_events(fork["job_id"])
    assert [p["node_id"] for p in of_type(events, "tool_invocation_started")] == ["b"]
    assert events[-1].payload["output"]["b"]["args"]["x"] == 2
    assert verify_job(api.store, fork["job_id"]).ok
    assert check_fork(api.store, fork["job_id"]).status == "verified"  # type: ignore[union-attr]
    with api.client("observer_a") as c:
        shown = c.get(f"/api/jobs/{fork['job_id']}").json()
        trace = c.get(f"/api/jobs/{fork['job_id']}/trace").json()
    assert shown["forked_from"]["job_id"] == source
    assert trace["forked_from"]["step"] == "a"


def test_fork_refused_over_http_writes_nothing(api: Api) -> None:
    waiting = api.waiting_job()
    done = api.runtime.submit(PLAN, {"x": 1}, namespace="a").job_id
    api.runtime.run_job(done)
    before = _jobs(api)
    with api.client("admin") as c:
        unsealed = c.post(f"/api/jobs/{waiting}/fork", json={"from_step": "a"})
        unknown = c.post(f"/api/jobs/{done}/fork", json={"from_step": "zz"})
        missing = c.post("/api/jobs/nope/fork", json={"from_step": "a"})
    assert unsealed.status_code == 409 and "no seal" in unsealed.text
    assert unknown.status_code == 409 and "no step 'zz'" in unknown.text
    assert missing.status_code == 404
    assert _jobs(api) == before
