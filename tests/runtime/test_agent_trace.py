"""An agent job's trace: its recorded calls in sequence order (kind, tool, state, attempts,
duration, waits), from the service, the CLI and — in tests/api — the HTTP API."""

from __future__ import annotations

import json

from affidavit.record._trace import job_trace
from affidavit.store import Store
from tests.cli.test_cli import cli
from tests.verify.agent_log import AgentLog, refund_agent_log, store_log


def test_completed_agent_job_is_its_sequence_of_calls(store: Store) -> None:
    log = refund_agent_log()
    trace = job_trace(store, store_log(store, log))
    assert trace["kind"] == "agent"
    assert trace["agent"]["name"] == "refund_agent" and trace["agent"]["version"] == "1"
    assert trace["plan_hash"] == trace["agent"]["agent_hash"]
    shown = [(n["id"], n["seq"], n["type"], n["tool"], n["state"]) for n in trace["nodes"]]
    assert shown == [
        ("#0", 0, "tool", "lookup_order", "side_effect_committed"),
        ("#1", 1, "pure", "decide_refund", "pure"),
        ("#2", 2, "approval", None, "approved"),  # (answered by a person, not a computation)
        ("#3", 3, "sleep", None, "pure"),
        ("#4", 4, "tool", "issue_refund", "side_effect_committed"),
        ("#5", 5, "now", None, "pure"),
        ("#6", 6, "tool", "send_email", "side_effect_committed"),
    ]
    refund = trace["nodes"][4]
    assert refund["attempts"] == 2
    assert [t["result_type"] for t in refund["tries"]] == [
        "retryable_failure",
        "side_effect_committed",
    ]
    assert refund["duration_ms"] == 4.0 and refund["output"] == {"refund_id": "R-1"}
    approval, sleep = trace["nodes"][2], trace["nodes"][3]
    assert approval["output"] == {"approved": True, "by": "ops"}
    assert approval["outcome"] == "pure" and approval["key"] == "big_refund"
    assert [(w["wait_type"], w["signalled_by"]) for w in approval["waits"]] == [
        ("approval", "operator")
    ]
    assert sleep["waits"][0]["wait_type"] == "timer" and "wake_at" in sleep["waits"][0]
    assert sleep["waits"][0]["signalled_by"] == "timer"
    assert trace["waiting_for"] == [] and trace["parked"] is None


def test_waiting_and_in_flight_steps(store: Store) -> None:
    waiting = AgentLog().start()
    waiting.tool("lookup_order", {"order_id": "A-1"}, {"total": 150})
    waiting.wait("approval", "big_refund", None, answered=False)
    trace = job_trace(store, store_log(store, waiting, status="waiting"))
    assert [n["state"] for n in trace["nodes"]] == ["side_effect_committed", "waiting"]
    assert trace["waiting_for"] == [{"node_id": "#1", "correlation_key": "big_refund"}]
    assert trace["nodes"][1]["correlation_key"] == "big_refund"

    crashed = AgentLog().start()
    crashed.tool("issue_refund", {"amount": 1}, None, in_flight=True)
    trace = job_trace(store, store_log(store, crashed, status="running"))
    (step,) = trace["nodes"]
    assert step["state"] == "in_flight"
    assert step["idempotency_key"] == crashed.ledger[0].key


def test_cli_trace_of_an_agent_job(store: Store, store_url: str) -> None:
    job_id = store_log(store, refund_agent_log())
    as_json = cli("jobs", "trace", job_id, "--db", store_url, "--json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["kind"] == "agent" and len(doc["nodes"]) == 7
    human = cli("jobs", "trace", job_id, "--db", store_url)
    assert human.returncode == 0, human.stderr
    for text in ("step", "kind", "waits", "issue_refund", "side_effect_committed", "by timer"):
        assert text in human.stdout, human.stdout
