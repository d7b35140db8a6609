"""Approvals over real HTTP with real keys, on both backends: the submitter and agent keys are
refused (403, nothing recorded), approver keys decide (recorded with principal, role and key
id), two-person rules, an empty decision refused, and a tool that requires approval waiting
for an approval of its call though the plan asks for none."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import TRANSFERS, Api

PLAN: dict[str, Any] = {
    "name": "approve-test",
    "nodes": [
        {"id": "ok", "type": "approval"},
        {"id": "t", "type": "pure", "tool": "think", "args": {"ok": "${ok}"}, "depends_on": ["ok"]},
    ],
}


def key_id(api: Api, who: str) -> str:
    return api.keys[who].removeprefix("Bearer ").split("_")[1]


def submitted(api: Api, graph: dict[str, Any], job_input: Any = None) -> str:
    """A job submitted by agent_a (agent id bot-a) over HTTP, run until it waits."""
    with api.client("agent_a") as c:
        r = c.post("/api/jobs", json={"plan": graph, "input": job_input or {}})
        assert r.status_code == 201, r.text
    job_id: str = r.json()["job_id"]
    assert api.runtime.run_job(job_id).status == "waiting"
    return job_id


def decide(api: Api, who: str, job_id: str, key: str, payload: Any = None) -> Any:
    body: dict[str, Any] = {"key": key}
    if payload is not None:
        body["payload"] = payload
    with api.client(who) as c:
        return c.post(f"/api/jobs/{job_id}/signal", json=body)


def test_the_submitter_approving_its_own_job_is_refused(api: Api) -> None:
    job_id = submitted(api, PLAN)
    version = api.runtime.get_job(job_id).version
    refused = decide(api, "agent_a", job_id, f"{job_id}:ok", {"approved": True})
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "approval_forbidden" and "submitted the job" in error["message"]
    assert "approver" in error["hint"]
    # another agent's agent key: refused too
    other = decide(api, "agent_a2", job_id, f"{job_id}:ok", {"approved": True})
    assert other.status_code == 403 and "role 'agent'" in other.json()["error"]["message"]
    assert api.runtime.get_job(job_id).version == version  # nothing recorded
    # what the page is told: the submitter's key may not decide this one, and why
    with api.client("agent_a") as c:
        [wait] = c.get(f"/api/jobs/{job_id}/decisions").json()["waits"]
    assert wait["may_decide"] is False and "submitted the job" in wait["why_not"]


def test_an_approver_key_decides_and_is_recorded(api: Api) -> None:
    job_id = submitted(api, PLAN)
    with api.client("approver_a") as c:
        found = c.get(f"/api/jobs/{job_id}/decisions").json()
    assert found["caller"]["may_approve"] is True and found["caller"]["may_signal"] is False
    assert found["waits"][0]["may_decide"] is True
    ok = decide(api, "approver_a", job_id, f"{job_id}:ok", {"approved": True, "comment": "fine"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["appended"] is True and ok.json()["status"] == "pending"
    [done] = [e.payload for e in api.store.list_events(job_id) if e.type == "wait_completed"]
    assert done["signalled_by"] == "ann"
    [decision] = done["decided_by"]
    assert (decision["principal"], decision["role"], decision["key_id"]) == (
        "ann",
        "approver",
        key_id(api, "approver_a"),
    )
    assert api.runtime.run_job(job_id).status == "completed"
    with api.client("approver_a") as c:
        assert c.get(f"/api/jobs/{job_id}/verify").json()["ok"] is True
        # an approver submits nothing
        assert c.post("/api/jobs", json={"plan": PLAN, "input": {}}).status_code == 403


def test_an_approver_of_another_namespace_does_not_see_the_job(api: Api) -> None:
    job_id = submitted(api, PLAN)
    assert decide(api, "approver_b", job_id, f"{job_id}:ok", {"approved": True}).status_code == 404


def test_two_person_rule_over_http(api: Api) -> None:
    graph = {**PLAN, "nodes": [{**PLAN["nodes"][0], "min_approvals": 2}, PLAN["nodes"][1]]}
    job_id = submitted(api, graph)
    key = f"{job_id}:ok"
    first = decide(api, "approver_a", job_id, key, {"approved": True})
    assert first.json()["appended"] is True and first.json()["status"] == "waiting"
    again = decide(api, "approver_a", job_id, key, {"approved": True})
    assert again.status_code == 200 and again.json()["appended"] is False
    assert again.json()["status"] == "waiting"
    with api.client("approver_a2") as c:
        [wait] = c.get(f"/api/jobs/{job_id}/decisions").json()["waits"]
    assert [a["principal"] for a in wait["approvals"]] == ["ann"]
    second = decide(api, "approver_a2", job_id, key, {"approved": True})
    assert second.json()["status"] == "pending"
    [done] = [e.payload for e in api.store.list_events(job_id) if e.type == "wait_completed"]
    assert [d["principal"] for d in done["decided_by"]] == ["ann", "ben"]


def test_an_empty_or_other_decision_is_refused(api: Api) -> None:
    job_id = submitted(api, PLAN)
    version = api.runtime.get_job(job_id).version
    for payload in (None, {}, True, "yes", {"approved": "yes"}, {"approved": True, "by": "x"}):
        refused = decide(api, "approver_a", job_id, f"{job_id}:ok", payload)
        assert refused.status_code == 422, (payload, refused.text)
        error = refused.json()["error"]
        assert error["code"] == "signal_payload_invalid" and '{"approved": true}' in error["hint"]
    assert api.runtime.get_job(job_id).version == version


def test_a_plan_without_the_approval_of_a_requiring_tool_waits_for_that_call(api: Api) -> None:
    graph = {"nodes": [{"id": "pay", "type": "tool", "tool": "transfer", "args": {"amount": 500}}]}
    before = len(TRANSFERS)
    job_id = submitted(api, graph)
    assert len(TRANSFERS) == before  # the tool did not run
    with api.client("approver_a") as c:
        [wait] = c.get(f"/api/jobs/{job_id}/decisions").json()["waits"]
    assert wait["wait_type"] == "approval" and wait["call"]["tool_name"] == "transfer"
    assert wait["payload"] == {"amount": 500}
    key = wait["correlation_key"]
    assert decide(api, "agent_a", job_id, key, {"approved": True}).status_code == 403
    assert decide(api, "approver_a", job_id, key, {"approved": True}).status_code == 200
    assert api.runtime.run_job(job_id).status == "completed"
    assert TRANSFERS[before:] == [500]
    # below the tool's threshold, no approval is asked for
    with api.client("agent_a") as c:
        small = {
            "nodes": [{"id": "pay", "type": "tool", "tool": "transfer", "args": {"amount": 50}}]
        }
        job = c.post("/api/jobs", json={"plan": small, "input": {}}).json()
    assert api.runtime.run_job(job["job_id"]).status == "completed"
    assert TRANSFERS[before:] == [500, 50]


def test_an_approver_key_may_not_signal_other_waits(api: Api) -> None:
    graph = {"nodes": [{"id": "w", "type": "wait"}]}
    job_id = submitted(api, graph)
    refused = decide(api, "approver_a", job_id, f"{job_id}:w", {"any": 1})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
