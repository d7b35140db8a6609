"""The HTTP API over real HTTP on loopback, on SQLite and PostgreSQL: every endpoint × role ×
namespace, error shapes, idempotent submit, pagination, signals, rate limits, metrics, and a
job run by a real worker process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

import affidavit.core.crash as crash_module
from affidavit import Runtime
from tests.api.conftest import TOOLS, WAITING_PLAN, Api
from tests.runtime.helpers import SimulatedCrash, wait_lease_expired
from tests.verify.helpers import RawDb

CALLERS = (
    "none",
    "not_bearer",
    "bad",
    "revoked",
    "observer_a",
    "approver_a",
    "agent_a",
    "agent_b",
    "admin",
)

# (name, method, path, body(job_id), expected status by caller). A job of namespace "a" waiting
# for approval is made fresh for every row. Other namespaces' jobs are 404, never 403.
UNAUTH = {"none": 401, "not_bearer": 401, "bad": 401, "revoked": 401}
Row = tuple[str, str, str, Callable[[str], Any], dict[str, int]]
ROWS: list[Row] = [
    ("get job", "GET", "/api/jobs/{job}", lambda j: None,
     {"observer_a": 200, "approver_a": 200, "agent_a": 200, "agent_b": 404, "admin": 200}),
    ("list jobs", "GET", "/api/jobs", lambda j: None,
     {"observer_a": 200, "approver_a": 200, "agent_a": 200, "agent_b": 200, "admin": 200}),
    ("events", "GET", "/api/jobs/{job}/events", lambda j: None,
     {"observer_a": 200, "approver_a": 200, "agent_a": 200, "agent_b": 404, "admin": 200}),
    ("trace", "GET", "/api/jobs/{job}/trace", lambda j: None,
     {"observer_a": 200, "approver_a": 200, "agent_a": 200, "agent_b": 404, "admin": 200}),
    ("submit", "POST", "/api/jobs", lambda j: {"plan": WAITING_PLAN, "input": {"x": 2}},
     {"observer_a": 403, "approver_a": 403, "agent_a": 201, "agent_b": 201, "admin": 201}),
    ("signal", "POST", "/api/jobs/{job}/signal",
     lambda j: {"key": f"{j}:ok", "payload": {"approved": True}},
     {"observer_a": 403, "approver_a": 200, "agent_a": 403, "agent_b": 404, "admin": 200}),
    ("resume (not parked)", "POST", "/api/jobs/{job}/resume", lambda j: {"decision": "continue"},
     {"observer_a": 403, "approver_a": 403, "agent_a": 403, "agent_b": 403, "admin": 409}),
    ("cancel", "POST", "/api/jobs/{job}/cancel", lambda j: {"reason": "test"},
     {"observer_a": 403, "approver_a": 403, "agent_a": 403, "agent_b": 403, "admin": 200}),
    ("verify", "GET", "/api/jobs/{job}/verify", lambda j: None,
     {"observer_a": 200, "approver_a": 200, "agent_a": 200, "agent_b": 404, "admin": 200}),
    ("seal keys", "GET", "/api/keys", lambda j: None,
     {"observer_a": 200, "approver_a": 200, "agent_a": 200, "agent_b": 200, "admin": 200}),
    ("unknown job", "GET", "/api/jobs/no-such-job", lambda j: None,
     {"observer_a": 404, "approver_a": 404, "agent_a": 404, "agent_b": 404, "admin": 404}),
    ("metrics", "GET", "/metrics", lambda j: None,
     {"observer_a": 403, "approver_a": 403, "agent_a": 403, "agent_b": 403, "admin": 200}),
    ("health", "GET", "/health", lambda j: None,
     dict.fromkeys(CALLERS, 200)),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_endpoint_role_namespace_matrix(api: Api, row: Row) -> None:
    name, method, path, body, allowed = row
    expected = {**UNAUTH, **allowed}
    for who in CALLERS:
        job_id = api.waiting_job("a")
        before = api.store.get_job(job_id)
        with api.client(None if who == "none" else who) as c:
            r = c.request(method, path.format(job=job_id), json=body(job_id))
        assert r.status_code == expected[who], (name, who, r.status_code, r.text)
        if r.status_code >= 400:
            error = r.json()["error"]
            assert set(error) == {"code", "message", "hint"} and error["message"]
            after = api.store.get_job(job_id)
            assert after.version == before.version, f"{name} by {who} wrote despite refusing"
        if r.status_code == 401:
            assert r.headers["www-authenticate"] == "Bearer"
        if r.status_code == 404 and "{job}" in path:
            assert job_id in r.json()["error"]["message"]  # same answer as a missing job


def test_list_shows_only_the_callers_namespace(api: Api) -> None:
    mine = api.waiting_job("a")
    theirs = api.waiting_job("b")
    with api.client("agent_a") as c:
        listed = {j["job_id"] for j in c.get("/api/jobs", params={"limit": 1000}).json()["jobs"]}
        assert mine in listed and theirs not in listed
        assert c.get("/api/jobs", params={"namespace": "b"}).status_code == 403
    with api.client("admin") as c:
        every = {j["job_id"] for j in c.get("/api/jobs", params={"limit": 1000}).json()["jobs"]}
        assert {mine, theirs} <= every
        only_b = c.get("/api/jobs", params={"namespace": "b", "limit": 1000}).json()["jobs"]
        assert theirs in {j["job_id"] for j in only_b} and all(
            j["namespace"] == "b" for j in only_b
        )


def test_list_pages_by_cursor_within_the_callers_namespace(api: Api) -> None:
    mine = [api.waiting_job("a") for _ in range(5)]
    theirs = api.waiting_job("b")
    with api.client("agent_a") as c:
        everything = [
            j["job_id"] for j in c.get("/api/jobs", params={"limit": 1000}).json()["jobs"]
        ]
        assert set(mine) <= set(everything) and theirs not in everything
        paged: list[str] = []
        params: dict[str, Any] = {"limit": 2}
        while True:
            r = c.get("/api/jobs", params=params)
            assert r.status_code == 200, r.text
            body = r.json()
            paged += [j["job_id"] for j in body["jobs"]]
            assert body.get("before") == params.get("before")
            if "next_before" not in body:  # a page that is not full is the last
                assert len(body["jobs"]) < 2
                break
            assert body["next_before"] == body["jobs"][-1]["job_id"]
            params["before"] = body["next_before"]
        assert paged == everything
        # another namespace's job as the cursor: not found, as for a job that does not exist
        for cursor in (theirs, "no-such-job"):
            r = c.get("/api/jobs", params={"before": cursor})
            assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found"
    with api.client("admin") as c:  # an admin may page from any job
        r = c.get("/api/jobs", params={"before": theirs, "limit": 1000})
        assert r.status_code == 200 and theirs not in {j["job_id"] for j in r.json()["jobs"]}


def test_submit_is_idempotent_and_validated(api: Api) -> None:
    with api.client("agent_a") as c:
        headers = {"Idempotency-Key": "order-7"}
        body = {"plan": WAITING_PLAN, "input": {"x": 7}}
        first = c.post("/api/jobs", json=body, headers=headers)
        again = c.post("/api/jobs", json=body, headers=headers)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["job_id"] == again.json()["job_id"]
        job = first.json()
        assert job["namespace"] == "a" and job["submitted_by"] == "bot-a"
        assert job["status"] == "pending" and job["event_count"] == 2
        changed = c.post("/api/jobs", json={**body, "input": {"x": 8}}, headers=headers)
        assert changed.status_code == 409
        assert changed.json()["error"]["code"] == "idempotency_conflict"
        referenced = {"nodes": [{"id": "x", "type": "wait", "args": {"v": "${input.missing}"}}]}
        unresolved = c.post("/api/jobs", json={"plan": referenced, "input": {}})
        assert unresolved.status_code == 422, unresolved.text
        assert unresolved.json()["error"]["code"] == "args_unresolvable"

        count = len(api.store.list_jobs())
        bad_plans: list[dict[str, Any]] = [
            {"plan": {"nodes": [{"id": "x", "type": "teleport"}]}},
            {"plan": {"nodes": [{"id": "x", "type": "tool", "tool": "unregistered"}]}},
            {"plan": WAITING_PLAN, "input": {"x": 1}, "replay_verification": "lenient"},
            {"plan": WAITING_PLAN, "unexpected": 1},
            {"input": {}},
        ]
        for bad in bad_plans:
            r = c.post("/api/jobs", json=bad)
            assert r.status_code == 422, (bad, r.text)
            code = r.json()["error"]["code"]
            assert code in ("invalid_request", "invalid_plan", "config_error") or code.startswith(
                "plan_"
            )
        r = c.post("/api/jobs", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 422
        deep = b'{"plan": {}, "input": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
        r = c.post("/api/jobs", content=deep, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text  # was 400 "There was an error parsing the body"
        error = r.json()["error"]
        assert error["code"] == "invalid_request" and "nested too deeply" in error["message"]
        assert "252 levels" in error["hint"]
        r = c.post("/api/jobs", json={"plan": WAITING_PLAN, "namespace": "b"})
        assert r.status_code == 403
        assert len(api.store.list_jobs()) == count  # nothing was written


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # the key given twice: at the top, in the input, deep in the plan
        ("/api/jobs", b'{"plan": PLAN, "input": {"x": 1}, "input": {"x": 2}}'),
        ("/api/jobs", b'{"plan": PLAN, "input": {"x": 1, "x": 2}}'),
        ("/api/jobs", b'{"plan": {"nodes": [{"id": "a", "id": "b", "type": "wait"}]}}'),
        ("/api/jobs/{job}/signal", b'{"key": "{job}:ok", "payload": {"ok": true, "ok": false}}'),
        ("/api/jobs/{job}/cancel", b'{"reason": "a", "reason": "b"}'),
    ],
    ids=["submit top", "submit input", "submit plan", "signal", "cancel"],
)
def test_a_body_giving_a_key_twice_is_refused_and_changes_nothing(
    api: Api, path: str, body: bytes
) -> None:
    """A JSON parser keeps the last of two equal keys; another reader of the same bytes may
    keep the first. The API refuses such a body (as plan files and the CLI do) before any
    route acts on it."""
    job = api.waiting_job()
    plan = json.dumps(WAITING_PLAN).encode()
    content = body.replace(b"PLAN", plan).replace(b"{job}", job.encode())
    before = (len(api.store.list_jobs()), api.store.get_job(job).status)
    with api.client("admin" if "cancel" in path else "agent_a") as c:
        url, json_type = path.replace("{job}", job), {"Content-Type": "application/json"}
        r = c.post(url, content=content, headers=json_type)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request"
    assert "appears twice in one object" in error["message"]
    assert (len(api.store.list_jobs()), api.store.get_job(job).status) == before


def test_events_pages_and_trace(api: Api) -> None:
    job_id = api.waiting_job("a")
    with api.client("observer_a") as c:
        seen: list[dict[str, Any]] = []
        after = 0
        while True:
            page = c.get(f"/api/jobs/{job_id}/events", params={"after_version": after,
                                                                "limit": 2}).json()  # fmt: skip
            seen += page["events"]
            if page["next_after_version"] is None:
                break
            after = page["next_after_version"]
        assert [e["version"] for e in seen] == list(range(1, api.store.get_job(job_id).version + 1))
        stored = api.store.list_events(job_id)
        assert [e["chain_hash"] for e in seen] == [e.chain_hash for e in stored]
        trace = c.get(f"/api/jobs/{job_id}/trace").json()
    states = {n["id"]: n["state"] for n in trace["nodes"]}
    assert states == {"a": "side_effect_committed", "ok": "waiting", "t": "pending"}
    assert trace["waiting_for"] == [
        {"node_id": "ok", "wait_type": "approval", "correlation_key": f"{job_id}:ok"}
    ]
    a = trace["nodes"][0]
    assert a["attempts"] == 1 and a["output"] == {"did": "a", "args": {"x": 1}}


def test_signal_errors_and_idempotence(api: Api) -> None:
    job_id = api.waiting_job("a")
    with api.client("approver_a") as c:
        wrong = c.post(f"/api/jobs/{job_id}/signal", json={"key": "nope"})
        assert wrong.status_code == 409 and wrong.json()["error"]["code"] == "signal_rejected"
        odd = c.post(f"/api/jobs/{job_id}/signal", json={"key": f"{job_id}:ok", "payload": False})
        assert odd.status_code == 422
        assert odd.json()["error"]["code"] == "signal_payload_invalid"
        yes, no = {"approved": True}, {"approved": False}
        ok = c.post(f"/api/jobs/{job_id}/signal", json={"key": f"{job_id}:ok", "payload": yes})
        again = c.post(f"/api/jobs/{job_id}/signal", json={"key": f"{job_id}:ok", "payload": no})
        assert (ok.json()["appended"], again.json()["appended"]) == (True, False)
        assert ok.json()["status"] == "pending"
    api.runtime.run_job(job_id)
    job = api.runtime.get_job(job_id)
    assert job.status == "completed" and job.output["t"]["thought"]["ok"] == yes


def parked_in_flight(api: Api, monkeypatch: pytest.MonkeyPatch, job_id: str | None) -> str:
    """The job (a new one when ``job_id`` is None) run until its tool step "crashes" after T1,
    then recovered: parked in flight (the tool has no reconcile hook)."""

    def crash_point(name: str) -> None:
        if name == "tool.after_acquire":
            raise SimulatedCrash(name)

    with Runtime(api.store.url, tools=TOOLS, lease_seconds=0.3) as rt:
        if job_id is None:
            job_id = rt.submit({"nodes": [{"id": "a", "type": "tool", "tool": "act"}]}, {},
                               namespace="a").job_id  # fmt: skip
        with monkeypatch.context() as patched:
            patched.setattr(crash_module, "crash_point", crash_point)
            with pytest.raises(SimulatedCrash):
                rt.run_job(job_id)
        wait_lease_expired(rt.store, job_id)
        assert rt.run_job(job_id).status == "parked"
    return job_id


def test_resume_pinned_to_a_park(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = parked_in_flight(api, monkeypatch, None)
    with api.client("admin") as c:
        first = c.get(f"/api/jobs/{job_id}/trace").json()["parked"]["version"]
        assert isinstance(first, int)
        for bad in (0, "3", True, 1.5):
            r = c.post(
                f"/api/jobs/{job_id}/resume", json={"decision": "retry", "park_version": bad}
            )
            assert r.status_code == 422, (bad, r.text)
        ok = c.post(f"/api/jobs/{job_id}/resume", json={"decision": "retry", "park_version": first})
        assert ok.status_code == 200, ok.text
        assert ok.json()["status"] == "pending"
        parked_in_flight(api, monkeypatch, job_id)  # the retry crashed in flight again
        second = c.get(f"/api/jobs/{job_id}/trace").json()["parked"]["version"]
        assert second > first
        before = api.store.get_job(job_id)
        stale = c.post(
            f"/api/jobs/{job_id}/resume", json={"decision": "fail", "park_version": first}
        )
        assert stale.status_code == 409, stale.text
        error = stale.json()["error"]
        assert error["code"] == "invalid_state"
        assert f"parked at version {second} for in_flight" in error["message"]
        assert f"version {first}" in error["message"]
        after = api.store.get_job(job_id)
        assert (after.version, after.status) == (before.version, "parked")  # nothing written
        done = c.post(
            f"/api/jobs/{job_id}/resume", json={"decision": "fail", "park_version": second}
        )
        assert done.status_code == 200 and done.json()["status"] == "failed"


def test_rate_limit_per_key(limited: Api) -> None:
    with limited.client("observer_a") as c:
        codes = [c.get("/api/jobs").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = c.get("/api/jobs")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limited"
    with limited.client("agent_a") as other:  # another key has its own budget
        assert other.get("/api/jobs").status_code == 200


def test_metrics_health_and_openapi(api: Api) -> None:
    api.waiting_job("a")
    with api.client("admin") as c:  # counts of every namespace: admins only
        c.get("/api/jobs")
        text = c.get("/metrics").text
        assert 'affidavit_jobs{status="waiting"}' in text
        assert 'affidavit_tool_invocations{status="committed"}' in text
        assert (
            'affidavit_http_request_duration_seconds_count{method="GET",route="/api/jobs"' in text
        )
    with api.client(None) as anon:
        health = anon.get("/health").json()
        assert health["status"] == "ok" and health["backend"] in ("sqlite", "postgresql")
        schema = anon.get("/openapi.json").json()
        assert {"/api/jobs", "/api/jobs/{job_id}/signal", "/health"} <= set(schema["paths"])
        assert anon.get("/docs").status_code == 200


def test_job_submitted_over_http_is_run_by_a_worker_process(api: Api, tmp_path: Any) -> None:
    tools = tmp_path / "api_tools.py"
    tools.write_text(
        "from affidavit import pure, tool\n"
        "@tool('act')\ndef act(ctx, **a): return {'did': ctx.node_id, 'args': a}\n"
        "@pure('think')\ndef think(ctx, **a): return {'thought': a}\n"
    )
    with api.client("agent_a") as c:
        job_id = c.post("/api/jobs", json={"plan": WAITING_PLAN, "input": {"x": 3}}).json()[
            "job_id"
        ]

        def worker() -> None:
            proc = subprocess.run(
                [sys.executable, "-m", "affidavit", "worker", "--tools", str(tools),
                 "--until-idle", "--db", api.store.url, "--json"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout)["jobs_run"] >= 1

        worker()
        assert c.get(f"/api/jobs/{job_id}").json()["status"] == "waiting"
        with api.client("approver_a") as approver:
            yes = {"key": f"{job_id}:ok", "payload": {"approved": True}}
            assert approver.post(f"/api/jobs/{job_id}/signal", json=yes).status_code == 200
        worker()
        done = c.get(f"/api/jobs/{job_id}").json()
    assert done["status"] == "completed"
    thought = {"a": {"did": "a", "args": {"x": 3}}, "ok": {"approved": True}}
    assert done["output"] == {"t": {"thought": thought}}


def test_a_job_row_edited_into_output_that_is_not_json_is_served(api: Api) -> None:
    """The job is served (200) with the edited field reported unreadable, not a 500; a sound
    job carries no `unreadable` field."""
    job_id = api.waiting_job("a")
    with api.client("observer_a") as c:
        sound = c.get(f"/api/jobs/{job_id}").json()
        assert "unreadable" not in sound
        assert all("unreadable" not in j for j in c.get("/api/jobs").json()["jobs"])
        RawDb(api.store.url).execute(
            "UPDATE jobs SET output = 'x', error = '{' WHERE job_id = ?", (job_id,)
        )
        got = c.get(f"/api/jobs/{job_id}")
        assert got.status_code == 200, got.text
        doc = got.json()
        assert doc["output"] is None and doc["error"] is None
        assert set(doc["unreadable"]) == {"output", "error"}
        assert "affidavit verify" in doc["unreadable"]["output"]
        listed = c.get("/api/jobs")
        assert listed.status_code == 200, listed.text
        (entry,) = [j for j in listed.json()["jobs"] if j["job_id"] == job_id]
        assert entry["unreadable"] == doc["unreadable"]
        trace = c.get(f"/api/jobs/{job_id}/trace")
        assert trace.status_code == 200, trace.text
        assert trace.json()["job"]["unreadable"] == doc["unreadable"]
        assert c.get(f"/api/jobs/{job_id}/verify").json()["ok"] is False
    RawDb(api.store.url).execute(
        "UPDATE jobs SET output = NULL, error = NULL WHERE job_id = ?", (job_id,)
    )
