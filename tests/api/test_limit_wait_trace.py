"""``GET /api/jobs/{id}/trace`` shows a call waiting for a limit's grant, on both backends."""

from __future__ import annotations

from tests.api.conftest import Api
from tests.runtime.test_limit_waits import one_call_waiting


def test_the_trace_shows_the_wait_for_a_limit(api: Api, db_url: str) -> None:
    with one_call_waiting(db_url, namespace="a") as (_, job_id, name):
        with api.client("observer_a") as client:
            r = client.get(f"/api/jobs/{job_id}/trace")
        assert r.status_code == 200, r.text
        wait = r.json()["waiting_for_limit"]
        assert wait["limit"] == name and wait["reason"] == "1 of 1 in flight"
    with api.client("observer_a") as client:
        r = client.get(f"/api/jobs/{job_id}/trace")
    assert r.status_code == 200 and "waiting_for_limit" not in r.json()
