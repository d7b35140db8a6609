"""``POST /api/jobs`` with a queue, a priority, a partition key and a time; ``GET /api/queues``."""

from __future__ import annotations

from affidavit.store.queues import queue_config, set_queue
from tests.api.conftest import WAITING_PLAN, Api


def test_submit_into_a_queue_and_list_queues(api: Api) -> None:
    set_queue(api.store, queue_config("api-llm", concurrency=2, rate="5/1s", priority=True))
    with api.client("agent_a") as c:
        body = {"plan": WAITING_PLAN, "input": {"x": 1}, "queue": "api-llm", "priority": 3,
                "partition_key": "customer-7", "not_before": "2000-01-01T00:00:00Z"}  # fmt: skip
        created = c.post("/api/jobs", json=body)
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        listed = c.get("/api/queues")
        assert listed.status_code == 200
        (mine,) = [q for q in listed.json()["queues"] if q["name"] == "api-llm"]
        assert (mine["concurrency"], mine["rate"], mine["priority"]) == (2, "5/1s", True)
        assert mine["pending"] >= 1
        unknown = c.post("/api/jobs", json={**body, "queue": "nope"})
        assert unknown.status_code == 422
        assert "queues set nope" in unknown.json()["error"]["hint"]
        naive = c.post("/api/jobs", json={**body, "not_before": "2030-01-01T00:00:00"})
        assert naive.status_code == 422
        default_with_key = c.post("/api/jobs", json={**body, "queue": None})
        assert default_with_key.status_code == 422
    with api.store.transaction() as tx:
        row = tx.query(
            "SELECT queue, priority, partition_key, not_before FROM jobs WHERE job_id = ?",
            (job_id,),
        )[0]
    assert (row[0], int(row[1]), row[2], float(row[3])) == ("api-llm", 3, "customer-7", 946684800.0)
