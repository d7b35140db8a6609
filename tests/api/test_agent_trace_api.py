"""``GET /api/jobs/{id}/trace`` of an agent job: its steps in sequence order, not a DAG."""

from __future__ import annotations

from tests.api.conftest import Api
from tests.verify.agent_log import AgentLog, store_log


def test_agent_trace_over_http(api: Api) -> None:
    log = AgentLog().start(namespace="a")
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 150})
    log.wait("approval", "big_refund", None, answered=False)
    job_id = store_log(api.store, log, status="waiting")
    with api.client("observer_a") as c:
        trace = c.get(f"/api/jobs/{job_id}/trace").json()
        verified = c.get(f"/api/jobs/{job_id}/verify").json()
    assert trace["kind"] == "agent" and trace["agent"]["name"] == "refund_agent"
    steps = [(n["id"], n["seq"], n["type"], n["tool"], n["state"]) for n in trace["nodes"]]
    assert steps == [
        ("#0", 0, "tool", "lookup_order", "side_effect_committed"),
        ("#1", 1, "approval", None, "waiting"),
    ]
    assert trace["nodes"][1]["waits"][0]["correlation_key"] == "big_refund"
    assert trace["nodes"][0]["attempts"] == 1 and trace["nodes"][0]["args_hash"]
    assert verified["ok"] is True
