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
from tests.verify.helpers import reseal_v1

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


def test_fork_idempotency_key_over_http(api: Api) -> None:
    source = api.runtime.submit(PLAN, {"x": 1}, namespace="a").job_id
    assert api.runtime.run_job(source).status == "completed"
    key = {"Idempotency-Key": "fork-once"}
    with api.client("admin") as c:
        first = c.post(f"/api/jobs/{source}/fork", json={"from_step": "a"}, headers=key)
        again = c.post(f"/api/jobs/{source}/fork", json={"from_step": "a"}, headers=key)
        count = _jobs(api)
        other_input = c.post(
            f"/api/jobs/{source}/fork", json={"from_step": "a", "input": {"x": 9}}, headers=key
        )
        other_step = c.post(f"/api/jobs/{source}/fork", json={"from_step": "b"}, headers=key)
        submitted = c.post(
            "/api/jobs",
            json={"plan": PLAN, "input": {"x": 1}, "namespace": "a"},
            headers={"Idempotency-Key": "j"},
        )
        not_a_fork = c.post(
            f"/api/jobs/{source}/fork", json={"from_step": "a"}, headers={"Idempotency-Key": "j"}
        )
        unkeyed = c.post(f"/api/jobs/{source}/fork", json={"from_step": "a"})
    assert first.status_code == 201 and again.status_code == 200, (first.text, again.text)
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.json()["forked_from"] == first.json()["forked_from"]
    for refused, what in ((other_input, "input"), (other_step, "step")):
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "idempotency_conflict"
        assert what in refused.json()["error"]["message"]
    assert submitted.status_code == 201
    assert not_a_fork.status_code == 409 and "not a fork" in not_a_fork.text
    assert _jobs(api) == count + 2  # the refused ones wrote nothing (a plan job, a new fork)
    assert unkeyed.status_code == 201 and unkeyed.json()["job_id"] != first.json()["job_id"]


def test_verify_over_http_checks_a_forks_prefix_against_its_source(api: Api) -> None:
    source = api.runtime.submit(PLAN, {"x": 1}, namespace="a").job_id
    assert api.runtime.run_job(source).status == "completed"
    fork = api.runtime.fork(source, "a").job_id
    assert api.runtime.run_job(fork).status == "completed"
    with api.client("observer_a") as c:
        good = c.get(f"/api/jobs/{fork}/verify").json()
        plain = c.get(f"/api/jobs/{source}/verify").json()
    assert good["ok"] is True
    assert good["forked_from"] == {"source_job_id": source, "step": "a", "status": "verified"}
    assert "forked_from" not in plain
    reseal_v1(api.store.url, source)  # the source re-sealed: not the seal the fork recorded
    with api.client("observer_a") as c:
        bad = c.get(f"/api/jobs/{fork}/verify").json()
    assert bad["ok"] is False and bad["forked_from"]["status"] == "failed"
    assert "seal hash" in bad["forked_from"]["problem"]
    assert verify_job(api.store, fork).ok  # the fork's own record still holds together
