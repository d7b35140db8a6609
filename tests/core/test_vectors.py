"""docs/formats.md §10: the public test vectors, for the formulas and for the stored chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from affidavit.core.agent_steps import AGENT_KINDS, agent_hash, agent_node_id, agent_step_id
from affidavit.core.canonical import canonical
from affidavit.core.chain import chain_root, execution_hash
from affidavit.core.plan import Plan, args_hash, external_key, idempotency_key
from affidavit.store import NewEvent, Store

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "formats_v1.json").read_text()
)


def test_plan_hash() -> None:
    plan = Plan.parse(VECTORS["task_graph"])
    assert plan.plan_hash == VECTORS["plan_hash"]
    assert plan.task_graph == VECTORS["task_graph"]


def test_step_ids() -> None:
    plan = Plan.parse(VECTORS["task_graph"])
    assert plan.step_ids(VECTORS["job_id"]) == VECTORS["step_ids"]


def test_idempotency_key() -> None:
    v = VECTORS["idempotency_key"]
    assert idempotency_key(v["job_id"], v["step_id"], v["tool"], v["args"]) == v["expected"]


def test_chain_root() -> None:
    events = [(eid, etype, canonical(p)) for eid, etype, p in VECTORS["chain"]["events"]]
    assert chain_root(events) == VECTORS["chain"]["root"]


def test_execution_hash() -> None:
    v = VECTORS["execution_hash"]
    pairs = [tuple(pair) for pair in v["finished"]]
    assert execution_hash(VECTORS["plan_hash"], pairs) == v["expected"]


def test_store_computes_the_vector_chain(store: Store) -> None:
    """The store's chain_hash at append time equals the published root, in one batch or split."""
    events = [NewEvent(t, p, event_id=e) for e, t, p in VECTORS["chain"]["events"]]
    job, _ = store.create_job(events=events[:1])
    stored = store.append(job.job_id, events[1:], expected_version=1)
    assert stored[-1].chain_hash == VECTORS["chain"]["root"]
    assert store.get_job(job.job_id).head_hash == VECTORS["chain"]["root"]
    listed = store.list_events(job.job_id)
    assert [e.payload_bytes for e in listed] == [
        canonical(p) for _, _, p in VECTORS["chain"]["events"]
    ]


@pytest.mark.parametrize("bad_root_event", [0, 1, 2])
def test_vector_chain_changes_with_any_event(bad_root_event: int) -> None:
    events = [(eid, etype, canonical(p)) for eid, etype, p in VECTORS["chain"]["events"]]
    eid, etype, payload = events[bad_root_event]
    events[bad_root_event] = (eid, etype, payload.replace(b"}", b',"x":1}'))
    assert chain_root(events) != VECTORS["chain"]["root"]


# --- agent jobs ---------------------------------------------------------------------------------

AGENT: dict[str, Any] = VECTORS["agent"]


def test_agent_hash() -> None:
    identity = {"agent": AGENT["agent"], "version": AGENT["version"]}
    assert canonical(identity).decode() == AGENT["identity_jcs"]
    assert agent_hash(AGENT["agent"], AGENT["version"]) == AGENT["agent_hash"]


@pytest.mark.parametrize(("seq", "kind", "node_id", "expected"), AGENT["steps"])
def test_agent_step_ids(seq: int, kind: str, node_id: str, expected: str) -> None:
    assert agent_node_id(seq) == node_id
    assert agent_step_id(AGENT["job_id"], seq, kind) == expected


def test_agent_step_id_depends_on_every_part() -> None:
    seq, kind, _, expected = AGENT["steps"][0]
    assert agent_step_id(AGENT["job_id"] + "x", seq, kind) != expected
    assert agent_step_id(AGENT["job_id"], seq + 1, kind) != expected
    assert agent_step_id(AGENT["job_id"], seq, "pure") != expected
    assert set(AGENT_KINDS) >= {kind for _, kind, _, _ in AGENT["steps"]}


def test_agent_tool_call_keys() -> None:
    call = AGENT["tool_call"]
    step = agent_step_id(AGENT["job_id"], call["seq"], "tool")
    assert args_hash(call["args"]) == call["args_hash"]
    assert (
        idempotency_key(AGENT["job_id"], step, call["tool"], call["args"])
        == (call["idempotency_key"])
    )
    assert external_key(AGENT["job_id"], step, None) == call["external_key"]


def test_agent_execution_hash() -> None:
    v = AGENT["execution_hash"]
    pairs = [tuple(pair) for pair in v["finished"]]
    assert execution_hash(AGENT["agent_hash"], pairs) == v["expected"]
