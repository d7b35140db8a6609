"""Agent jobs run by the real runtime, verified, traced and exported without their code, on both
backends: every sample agent's log verifies; its pack is MATCH; tampering with it is caught."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime, verify_job
from affidavit.core.canonical import canonical, parse
from affidavit.core.ids import new_event_id
from affidavit.packs import export_pack, verify_pack
from affidavit.record._sealing import Sealer
from affidavit.record._trace import job_trace
from tests.packs.helpers import assay_verify
from tests.runtime import agent_tools as at
from tests.verify.helpers import RawDb


@pytest.fixture
def rt(store_url: str) -> Iterator[Runtime]:
    at.CALLS.clear()
    with Runtime(store_url, tools=at.registry(), lease_seconds=30) as runtime:
        yield runtime


def _due(rt: Runtime, job_id: str) -> None:
    """Until the job's timer came due (its wake time, as stored, has passed)."""
    end = time.monotonic() + 30
    while time.monotonic() < end:
        expires = rt.store.get_job(job_id).lease_expires_at
        if expires is not None and expires < time.time():
            return
        time.sleep(0.05)
    raise AssertionError("the timer never came due")


def _run(rt: Runtime, name: str) -> str:
    """Run the sample agent ``name`` to its end (signals and timers included)."""
    inputs: dict[str, Any] = {
        "refund_agent": {"order_id": "BIG-1"},
        "fanout_agent": {"n": 3},
        "async_agent": {"n": 2},
        "wait_agent": {},
        "timed_wait_agent": {"timeout": 0.2},
        "sleep_agent": {"seconds": 0.2},
    }
    agent = "wait_agent" if name == "timed_wait_agent" else name
    job_id = rt.submit(agent, inputs.get(name, {})).job_id
    job = rt.run_job(job_id)
    if name == "refund_agent":
        assert job.status == "waiting"
        rt.signal(job_id, "big_refund", {"approved": True, "comment": "ops"}, approver="ops")
        job = rt.run_job(job_id)
    elif name == "wait_agent":
        rt.signal(job_id, "go", {"x": 1})
        job = rt.run_job(job_id)
    elif name in ("timed_wait_agent", "sleep_agent"):
        _due(rt, job_id)
        rt.run_until_idle()
        job = rt.get_job(job_id)
    assert job.status in ("completed", "failed"), (job.status, job.error)
    return job_id


AGENTS = [
    "refund_agent",
    "fanout_agent",
    "async_agent",
    "values_agent",
    "wait_agent",
    "timed_wait_agent",
    "sleep_agent",
    "retry_agent",
    "failing_agent",
    "raising_agent",
]


@pytest.mark.parametrize("name", AGENTS)
def test_runtime_agent_log_verifies_and_exports(rt: Runtime, tmp_path: Path, name: str) -> None:
    job_id = _run(rt, name)
    result = verify_job(rt.store, job_id)
    assert result.ok, result.to_dict()
    trace = job_trace(rt.store, job_id)
    calls = [e.payload for e in rt.store.list_events(job_id) if e.type == "step_called"]
    assert [n["seq"] for n in trace["nodes"]] == [c["seq"] for c in calls]
    assert [n["type"] for n in trace["nodes"]] == [c["kind"] for c in calls]
    pack = export_pack(rt.store, job_id, tmp_path / "pack")
    checked = verify_pack(pack.pack_dir)
    assert (checked.verdict, checked.exit_code) == ("MATCH", 0), checked.errors


@pytest.mark.parametrize("name", ["refund_agent", "sleep_agent", "failing_agent"])
def test_assay_says_match_on_runtime_agent_packs(rt: Runtime, tmp_path: Path, name: str) -> None:
    job_id = _run(rt, name)
    pack = export_pack(rt.store, job_id, tmp_path / "pack")
    code, receipt, details = assay_verify(pack.pack_dir, tmp_path / "assay-out")
    assert (code, receipt.get("verdict")) == (0, "MATCH"), details


def _resealed(rt: Runtime, raw: RawDb, job_id: str, edit: Any) -> None:
    """``edit`` the decoded log, re-chain it and seal it again with the runtime's own key
    (a forger holding the key): only the replay proof can tell."""
    events = [(e, t, parse(p)) for _, e, t, p, _ in raw.events(job_id)]
    edit(events)
    raw.rewrite_log(job_id, [(e, t, canonical(p)) for e, t, p in events])
    raw.execute("DELETE FROM seals WHERE job_id = ?", (job_id,))
    version, _, _, _, root = raw.events(job_id)[-1]
    seal = Sealer.for_store(rt.store).key().seal(job_id, version, root)
    with rt.store.transaction() as tx:
        tx.seal_insert(seal)


def _index(events: list[Any], event_type: str, nth: int = 0) -> int:
    return [i for i, (_, t, _) in enumerate(events) if t == event_type][nth]


def test_tampering_with_a_runtime_agent_log(rt: Runtime, store_url: str) -> None:
    raw = RawDb(store_url)
    job_id = _run(rt, "refund_agent")
    # an edited byte: the stored chain
    version = next(v for v, _, t, _, _ in raw.events(job_id) if t == "step_called")
    payload = raw.events(job_id)[version - 1][3].replace(b'"BIG-1"', b'"BIG-2"')
    raw.set_payload(job_id, version, payload)
    result = verify_job(rt.store, job_id)
    assert result.stored_chain.first_bad_version == version

    def refund_again(events: list[Any]) -> None:  # the refund executed a second time
        at_ = _index(events, "tool_invocation_started", 1)
        again = dict(events[at_][2], invocation_id=new_event_id())
        events.insert(len(events) - 1, (new_event_id(), "tool_invocation_started", again))

    def calls_swapped(events: list[Any]) -> None:
        a, b = _index(events, "step_called", 0), _index(events, "step_called", 1)
        events[a][2]["seq"], events[b][2]["seq"] = events[b][2]["seq"], events[a][2]["seq"]

    def approval_dropped(events: list[Any]) -> None:
        del events[_index(events, "wait_completed")]

    for edit, invariant in (
        (refund_again, "committed_once"),
        (calls_swapped, "sequence"),
        (approval_dropped, "sequence"),
    ):
        fresh = _run(rt, "refund_agent")
        _resealed(rt, raw, fresh, edit)
        result = verify_job(rt.store, fresh)
        assert result.seal.ok and result.stored_chain.ok
        assert result.replay_proof_result.invariant == invariant, result.replay_proof_result.error
