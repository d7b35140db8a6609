"""``POST /api/jobs/{id}/cancel`` with a tool call in flight: a cancel request the call finishes
under (recorded committed, then the job ends cancelled), or with ``force`` the call recorded as
``unknown``. Real HTTP on loopback, a worker thread inside the tool, both backends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.verify import verify_job
from tests.api.conftest import Api
from tests.runtime.helpers import assert_log_sound, of_type


class Gated:
    """A tool call that runs until the test releases it."""

    def __init__(self) -> None:
        self.inside, self.release = threading.Event(), threading.Event()

    def __call__(self, ctx: ToolContext) -> dict[str, Any]:
        self.inside.set()
        self.release.wait(30)
        return {"done": ctx.node_id}


PLAN = {
    "name": "gated",
    "nodes": [
        {"id": "g", "type": "tool", "tool": "gated"},
        {"id": "after", "type": "tool", "tool": "gated", "depends_on": ["g"]},
    ],
}


@pytest.fixture
def running(api: Api, db_url: str) -> Iterator[tuple[str, Gated, list[str | None], Runtime]]:
    """A job whose first call is in flight in a worker thread of this process."""
    gated = Gated()
    with Runtime(db_url, tools=ToolRegistry([Tool("gated", gated, "tool")])) as rt:
        job = rt.submit(PLAN, {}, namespace="a")
        status: list[str | None] = []
        t = threading.Thread(target=lambda: status.append(rt.worker.run_once(job.job_id)))
        t.start()
        assert gated.inside.wait(30)
        try:
            yield job.job_id, gated, status, rt
        finally:
            gated.release.set()
            t.join(30)


def wait_status(status: list[str | None]) -> None:
    """Until the worker thread's run has returned (its status appended)."""
    for _ in range(3000):
        if status:
            return
        threading.Event().wait(0.01)


def outcomes(api: Api, job_id: str) -> list[str]:
    finished = of_type(api.store.list_events(job_id), "tool_invocation_finished")
    return [p["outcome"] for p in finished]


def test_cancel_over_http_lets_the_call_finish(
    api: Api, running: tuple[str, Gated, list[str | None], Runtime]
) -> None:
    job_id, gated, status, _ = running
    with api.client("admin") as c:
        r = c.post(f"/api/jobs/{job_id}/cancel", json={"reason": "stop"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["status"] == "running"
    assert doc["cancel"]["state"] == "requested" and doc["cancel"]["waiting_on"] == "in_flight"
    assert [c["node_id"] for c in doc["cancel"]["in_flight"]] == ["g"]
    assert outcomes(api, job_id) == []
    gated.release.set()
    with api.client("admin") as c:
        again = c.post(f"/api/jobs/{job_id}/cancel", json={"reason": "again"})
    # (a second request while the first waits returns the first; once ended: 409)
    assert again.status_code in (200, 409)
    wait_status(status)
    assert status == ["cancelled"]
    assert api.store.get_job(job_id).status == "cancelled"
    assert outcomes(api, job_id) == ["success"]
    events = assert_log_sound(api.store, job_id)
    assert of_type(events, "job_cancelled")[0]["reason"] == "stop"
    assert verify_job(api.store, job_id).ok


def test_cancel_force_over_http_records_unknown(
    api: Api, running: tuple[str, Gated, list[str | None], Runtime]
) -> None:
    job_id, gated, status, _ = running
    with api.client("admin") as c:
        r = c.post(f"/api/jobs/{job_id}/cancel", json={"force": True})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["status"] == "cancelled" and doc["cancel"]["state"] == "cancelled"
    assert [c["node_id"] for c in doc["cancel"]["abandoned"]] == ["g"]
    assert outcomes(api, job_id) == ["unknown"]
    result = verify_job(api.store, job_id)
    assert result.ok and len(result.tool_invocation_ledger_proof.unknown_outcome_keys) == 1
    with api.client("admin") as c:
        shown = c.get(f"/api/jobs/{job_id}/verify").json()
    assert len(shown["tool_invocation_ledger_proof"]["unknown_outcome_keys"]) == 1
    gated.release.set()
    wait_status(status)
    assert status == ["lost"]  # the worker's late outcome was fenced off
    assert outcomes(api, job_id) == ["unknown"]


def test_cancel_over_http_of_a_waiting_job_is_at_once(api: Api) -> None:
    job_id = api.waiting_job()
    with api.client("admin") as c:
        r = c.post(f"/api/jobs/{job_id}/cancel", json={})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled" and r.json()["cancel"]["state"] == "cancelled"
    assert verify_job(api.store, job_id).ok
