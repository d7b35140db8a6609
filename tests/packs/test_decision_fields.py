"""Both halves of the pack — the exporter (from the job's trace) and the verifier's reading of
the event log — give every step the same trace when decision events carry fields they do not
know (who approved, in what role, a note) and when an invocation in doubt is closed with the
outcome ``unknown`` rather than ``lost``: such logs cannot change what a pack records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime, ToolRegistry
from affidavit.core.canonical import canonical
from affidavit.packs._export_steps import episode_of, step_records
from affidavit.packs._log_traces import INVOCATION_OUTCOMES, log_traces
from affidavit.record import agent_trace_of, is_agent_log, trace_of
from affidavit.store import StoredEvent
from tests.packs.scenarios import Env, build

DECISIONS = ("wait_completed", "job_resumed", "job_cancelled", "job_parked")
EXTRA = {"approver": {"id": "ann", "role": "approver"}, "decision_note": "checked twice"}


def _rewritten(events: list[StoredEvent]) -> tuple[list[StoredEvent], set[str]]:
    """The events with extra fields in every decision event and the outcomes ``lost`` and
    ``unknown`` swapped (neither is a result); and which of those rewrites the log had room
    for."""
    out: list[StoredEvent] = []
    did: set[str] = set()
    for e in events:
        p: dict[str, Any] = dict(e.payload)
        if e.type in DECISIONS:
            p.update(EXTRA)
            did.add(e.type)
        if e.type == "tool_invocation_finished" and p.get("outcome") in ("lost", "unknown"):
            p["outcome"] = "unknown" if p["outcome"] == "lost" else "lost"
            did.add("unknown")
        out.append(StoredEvent(e.job_id, e.version, e.event_id, e.type, canonical(p), e.chain_hash))
    return out, did


def _exported_traces(job: Any, events: list[StoredEvent]) -> dict[str, bytes]:
    trace, log = agent_trace_of(job, events) if is_agent_log(events) else trace_of(job, events)
    episode = episode_of(trace)
    times = (str(events[0].payload["at"]), str(events[-1].payload["at"]))
    input_ = events[0].payload.get("input")
    return step_records(episode, "ep_x", job, input_, log, times).traces


CASES = [
    pytest.param("approved", "plan", {"wait_completed"}, id="approved-plan"),
    pytest.param("approved", "agent", {"wait_completed"}, id="approved-agent"),
    pytest.param("cancelled_running", "plan", {"job_cancelled"}, id="cancelled_running-plan"),
    pytest.param("cancelled_running", "agent", {"job_cancelled"}, id="cancelled_running-agent"),
    pytest.param("parked_accepted", "plan", {"job_parked", "job_resumed"}, id="parked-plan"),
    pytest.param(
        "parked_failed", "agent", {"job_parked", "job_resumed", "unknown"}, id="parked-agent"
    ),
]


def test_the_packs_reading_of_the_log_takes_an_unknown_outcome() -> None:
    """The verifier's half alone, for a plan job's log: an in-doubt call is no result."""
    log = [
        ("job_created", {"input": {"a": 1}}),
        ("node_started", {"node_id": "pay", "step_id": "s1"}),
        ("tool_invocation_started", {"node_id": "pay", "idempotency_key": "k"}),
        ("tool_invocation_finished", {"idempotency_key": "k", "outcome": "unknown"}),
        ("job_cancelled", {"reason": "stop", **EXTRA}),
    ]
    traces = log_traces(log)
    assert traces.of("s1") == {"outcome": None, "error": None}
    assert traces.of("s2") == {"outcome": "not_run", "job_status": "cancelled"}
    assert traces.job_input == {"a": 1}


@pytest.mark.parametrize(("kind", "job_kind", "rewrites"), CASES)
def test_unknown_decision_fields_and_an_unknown_outcome_change_no_trace(
    store_url: str,
    tmp_path: Path,
    make_runtime: Callable[[ToolRegistry], Runtime],
    kind: str,
    job_kind: str,
    rewrites: set[str],
) -> None:
    job_id = build(Env(store_url, tmp_path, make_runtime), kind, job_kind)
    store = make_runtime(ToolRegistry([])).store
    job, events = store.get_job(job_id), store.list_events(job_id)
    rewritten, did = _rewritten(events)
    assert rewrites <= did  # the log had each event the case is about
    exported = _exported_traces(job, events)
    assert _exported_traces(job, rewritten) == exported
    expected = log_traces((e.type, e.payload) for e in rewritten)
    assert {sid: canonical(expected.of(sid)) for sid in exported} == exported


def test_every_invocation_outcome_is_mapped() -> None:
    from affidavit.core.payloads import ToolInvocationFinished

    recorded = set(ToolInvocationFinished.model_fields["outcome"].annotation.__args__)
    assert recorded | {"unknown"} <= set(INVOCATION_OUTCOMES)
    assert [o for o, gives in INVOCATION_OUTCOMES.items() if gives] == ["success"]
