"""Verification of agent jobs: the same proofs as for plan jobs, offline and without the agent's
code — an untouched log verifies; each edit, insertion, deletion or reordering is caught, on
both backends, by the check each case names."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from affidavit import verify_job
from affidavit.core.agent_steps import agent_hash
from affidavit.core.canonical import canonical
from affidavit.core.chain import execution_hash
from affidavit.core.ids import new_event_id
from affidavit.core.plan import args_hash
from affidavit.store import Store
from affidavit.verify import VerificationResult, verify_events
from tests.verify.agent_log import AgentLog, Event, refund_agent_log, store_log
from tests.verify.helpers import RawDb, rows, synthetic_log


def failing(result: VerificationResult) -> set[str]:
    return {c.name for c in result.checks() if not c.ok}


def invariant(result: VerificationResult) -> str | None:
    return result.replay_proof_result.invariant


@pytest.fixture
def raw(store_url: str) -> RawDb:
    return RawDb(store_url)


# --- an untouched agent job ---------------------------------------------------------------------


def test_agent_job_verifies(store: Store) -> None:
    log = refund_agent_log()
    job_id = store_log(store, log)
    result = verify_job(store, job_id)
    assert result.ok, result.to_dict()
    assert result.stored_chain.event_count == len(log.events)
    assert result.seal.present and result.seal.ok


def test_execution_hash_is_over_agent_identity_and_recorded_calls(store: Store) -> None:
    log = refund_agent_log()
    job_id = store_log(store, log)
    finished = [(p["node_id"], p["result_type"]) for t, p in log.events if t == "node_finished"]
    assert ("#4", "retryable_failure") in finished  # every node_finished counts, in log order
    expected = execution_hash(agent_hash("refund_agent", "1"), finished)
    assert verify_job(store, job_id).execution_hash == expected
    # another agent version is another execution
    other = AgentLog(job_id=log.job_id, version="2")
    assert agent_hash(other.agent, other.version) != agent_hash(log.agent, log.version)


def _unpinned(log: AgentLog, events: list[Event]) -> None:
    """The log as an unpinned agent writes it: ``agent_version`` null, the source's hash
    recorded with the job and with each step."""
    started = _payload(events, log, "agent_started", 0)
    started.update(agent_version=None, agent_hash=agent_hash(log.agent, None))
    started["code_sha256"] = "a" * 64
    for t, p in events:
        if t == "step_called":
            p["code_sha256"] = "b" * 64 if p["seq"] > 1 else "a" * 64  # edited code continued


def test_an_unpinned_agent_job_verifies(store: Store) -> None:
    log = refund_agent_log()
    events = copy.deepcopy(log.events)
    _unpinned(log, events)
    job_id = store_log(store, log, events=events, status="completed")
    result = verify_job(store, job_id)
    assert result.ok, result.to_dict()
    finished = [(p["node_id"], p["result_type"]) for t, p in events if t == "node_finished"]
    assert result.execution_hash == execution_hash(agent_hash("refund_agent", None), finished)


def test_offline_verification_agrees(store: Store) -> None:
    job_id = store_log(store, refund_agent_log())
    online = verify_job(store, job_id)
    seal = store.get_seal(job_id)
    assert seal is not None
    with store.transaction() as tx:
        ledger = tx.ledger_list(job_id)
    assert len(ledger) == 3
    offline = verify_events(
        store.list_events(job_id),
        public_keys=store.signing_keys(),
        seal=seal,
        ledger=ledger,
        status="completed",
    )
    assert offline.to_dict() == online.to_dict()


def test_running_job_lists_its_in_flight_key(store: Store) -> None:
    log = AgentLog().start()
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 1})
    log.tool("issue_refund", {"amount": 1}, None, in_flight=True)
    job_id = store_log(store, log, status="running")
    result = verify_job(store, job_id)
    assert result.ok, result.to_dict()
    assert result.tool_invocation_ledger_proof.pending_idempotency_keys == (log.ledger[-1].key,)


def _parked_nondeterministic() -> AgentLog:
    """A replay called something else than step #1 recorded: the job parked there."""
    log = AgentLog().start()
    log.tool("lookup_order", {"order_id": "A-1"}, {"total": 1})
    log.pure("decide_refund", {"order": {"total": 1}}, {"amount": 1})
    step = log.events[log.index("step_called", 1)][1]
    log.add(
        "job_parked",
        reason="nondeterministic",
        node_id="#1",
        step_id=step["step_id"],
        detail={
            "seq": 1,
            "recorded": {"kind": "pure", "tool_name": "decide_refund", "args_hash": "x"},
            "called": {"kind": "tool", "tool_name": "issue_refund", "args_hash": "y"},
        },
    )
    return log


def test_nondeterministic_park_then_fail_verifies(store: Store) -> None:
    """The park names a recorded step; a person fails the job; both logs verify."""
    parked = _parked_nondeterministic()
    assert verify_job(store, store_log(store, parked, status="parked")).ok
    failed = _parked_nondeterministic()
    failed.add("job_resumed", decision="fail", by="ops", note=None)
    failed.add("job_failed", error={"type": "nondeterministic", "message": "code changed"})
    result = verify_job(store, store_log(store, failed))
    assert result.ok, result.to_dict()
    assert result.status == "failed"


# --- tampering with the stored log (a sealed job) -----------------------------------------------


def _sealed(store: Store) -> tuple[str, AgentLog]:
    log = refund_agent_log()
    return store_log(store, log), log


def test_edit_a_recorded_calls_args(store: Store, raw: RawDb) -> None:
    job_id, log = _sealed(store)
    version = log.index("step_called", 4) + 1  # the refund
    payload = raw.events(job_id)[version - 1][3].replace(b'"amount":150', b'"amount":950')
    raw.set_payload(job_id, version, payload)
    result = verify_job(store, job_id)
    assert "stored_chain" in failing(result)
    assert result.stored_chain.first_bad_version == version


def test_delete_a_step_called(store: Store, raw: RawDb) -> None:
    job_id, log = _sealed(store)
    version = log.index("step_called", 5) + 1
    raw.execute("DELETE FROM events WHERE job_id = ? AND version = ?", (job_id, version))
    result = verify_job(store, job_id)
    assert result.stored_chain.first_bad_version == version
    assert not result.ok


def test_reorder_two_steps(store: Store, raw: RawDb) -> None:
    job_id, log = _sealed(store)
    a, b = log.index("step_called", 1) + 1, log.index("step_called", 2) + 1
    raw.execute("UPDATE events SET version = -1 WHERE job_id = ? AND version = ?", (job_id, a))
    raw.execute("UPDATE events SET version = ? WHERE job_id = ? AND version = ?", (a, job_id, b))
    raw.execute("UPDATE events SET version = ? WHERE job_id = ? AND version = -1", (b, job_id))
    result = verify_job(store, job_id)
    assert "stored_chain" in failing(result)
    assert result.stored_chain.first_bad_version == a


def test_insert_a_forged_call_and_rechain(store: Store, raw: RawDb) -> None:
    """A forger appends a plausible extra call before the end and re-chains: the chain and the
    replay proof cannot tell, the seal can."""
    job_id, log = _sealed(store)
    events = [(e, t, p) for _, e, t, p, _ in raw.events(job_id)]
    forged = AgentLog(job_id=job_id, seq=log.seq)
    forged.recorded("uuid", "0f0e")
    at = len(events) - 1
    for offset, (event_type, payload) in enumerate(forged.events):
        events.insert(at + offset, (new_event_id(), event_type, canonical(payload)))
    raw.rewrite_log(job_id, events)
    result = verify_job(store, job_id)
    assert result.stored_chain.ok
    assert result.replay_proof_result.ok
    assert failing(result) == {"seal"}


def test_truncate_and_rechain(store: Store, raw: RawDb) -> None:
    job_id, log = _sealed(store)
    events = [(e, t, p) for _, e, t, p, _ in raw.events(job_id)]
    raw.rewrite_log(job_id, events[: log.index("step_called", 6)])
    result = verify_job(store, job_id)
    assert "seal" in failing(result)


def test_edit_the_recorded_return(store: Store, raw: RawDb) -> None:
    """The job row's output is the agent's return as the log records it."""
    job_id, _ = _sealed(store)
    raw.execute("UPDATE jobs SET output = ? WHERE job_id = ?", ('{"refunded":9999}', job_id))
    result = verify_job(store, job_id)
    assert invariant(result) == "status"


def test_edit_a_ledger_row(store: Store, raw: RawDb) -> None:
    job_id, log = _sealed(store)
    raw.execute(
        "UPDATE tool_invocations SET args_hash = 'ffffffffffffffff' WHERE job_id = ? "
        "AND idempotency_key = ?",
        (job_id, log.ledger[1].key),
    )
    result = verify_job(store, job_id)
    assert not result.tool_invocation_ledger_proof.ok
    assert "args_hash" in " ".join(result.tool_invocation_ledger_proof.errors)


# --- forged logs, re-chained and re-sealed (only the replay proof can tell) ---------------------

Edit = Callable[[AgentLog, list[Event]], None]


def _payload(events: list[Event], log: AgentLog, event_type: str, nth: int) -> dict[str, Any]:
    return events[log.index(event_type, nth)][1]


def _drop(event_type: str, nth: int = 0, node: str | None = None) -> Edit:
    def edit(log: AgentLog, events: list[Event]) -> None:
        del events[log.index(event_type, nth, node)]

    return edit


def _swap_seqs(log: AgentLog, events: list[Event]) -> None:
    a, b = _payload(events, log, "step_called", 1), _payload(events, log, "step_called", 2)
    a["seq"], b["seq"] = b["seq"], a["seq"]


def _repeat_a_call(log: AgentLog, events: list[Event]) -> None:
    at = log.index("step_called", 2)
    events.insert(at, copy.deepcopy(events[log.index("step_called", 1)]))


def _other_args_rehashed(log: AgentLog, events: list[Event]) -> None:
    call = _payload(events, log, "step_called", 4)
    call["args"] = {"amount": 950, "order_id": "A-1"}
    call["args_hash"] = args_hash(call["args"])


def _other_args(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "step_called", 4)["args"] = {"amount": 950, "order_id": "A-1"}


def _other_tool(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "step_called", 4)["tool_name"] = "issue_voucher"


def _other_kind(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "step_called", 4)["kind"] = "pure"


def _execute_twice(log: AgentLog, events: list[Event]) -> None:
    """The refund runs again after its commit (a second T1 with the committed key)."""
    first = log.index("tool_invocation_started", 2)  # the refund's successful try
    again = copy.deepcopy(events[first])
    again[1]["invocation_id"] = "inv-again"
    events.insert(log.index("node_finished", 1, "#4") + 1, again)


def _approval_output(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "node_finished", 2)["output"] = {"approved": True, "by": "mallory"}


def _timer_early(log: AgentLog, events: list[Event]) -> None:
    fired = _payload(events, log, "wait_completed", 1)
    fired["at"] = "2026-11-28T04:00:00.000000Z"


def _timer_by_hand(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "wait_completed", 1)["signalled_by"] = "operator"


def _agent_hash(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "agent_started", 0)["agent_hash"] = agent_hash("refund_agent", "2")


def _agent_version(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "agent_started", 0)["agent_version"] = "2"


def _unpinned_under_the_pinned_hash(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "agent_started", 0)["agent_version"] = None


def _no_version_at_all(log: AgentLog, events: list[Event]) -> None:
    started = _payload(events, log, "agent_started", 0)
    del started["agent_version"]
    started["agent_hash"] = agent_hash(log.agent, None)


def _code_hash(event_type: str, value: Any) -> Edit:
    def edit(log: AgentLog, events: list[Event]) -> None:
        _unpinned(log, events)
        _payload(events, log, event_type, 0)["code_sha256"] = value

    return edit


def _not_an_agent_job(log: AgentLog, events: list[Event]) -> None:
    del _payload(events, log, "job_created", 0)["kind"]


def _plan_too(log: AgentLog, events: list[Event]) -> None:
    events.insert(2, ("plan_generated", {"at": log.at(), "task_graph": {"nodes": []}}))


def _event_before_its_call(log: AgentLog, events: list[Event]) -> None:
    at = log.index("step_called", 3)
    events.insert(at - 1, events.pop(at + 1))  # the sleep's node_started first


def _step_id(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "step_called", 0)["step_id"] = "0123456789abcdef"


def _node_id(log: AgentLog, events: list[Event]) -> None:
    _payload(events, log, "step_called", 0)["node_id"] = "lookup"


FORGED: dict[str, tuple[Edit, str]] = {
    # (the edit, the invariant the replay proof names)
    "call_deleted": (_drop("step_called", 1), "node_in_plan"),
    "seqs_swapped": (_swap_seqs, "sequence"),
    "call_repeated": (_repeat_a_call, "sequence"),
    "args_changed_and_rehashed": (_other_args_rehashed, "sequence"),
    "args_changed": (_other_args, "sequence"),
    "tool_changed": (_other_tool, "node_in_plan"),
    "kind_changed": (_other_kind, "node_in_plan"),
    "step_id_changed": (_step_id, "node_in_plan"),
    "node_id_changed": (_node_id, "sequence"),
    "tool_executed_twice": (_execute_twice, "committed_once"),
    "wait_never_answered": (_drop("wait_completed", 0), "sequence"),
    "approval_output_not_the_signal": (_approval_output, "sequence"),
    "timer_fired_early": (_timer_early, "closing_rule"),
    "timer_answered_by_hand": (_timer_by_hand, "closing_rule"),
    "step_never_finished": (_drop("node_finished", 0, "#1"), "after_terminal"),
    "agent_hash_changed": (_agent_hash, "plan"),
    "agent_version_changed": (_agent_version, "plan"),
    "unpinned_under_the_pinned_hash": (_unpinned_under_the_pinned_hash, "plan"),
    "agent_version_removed": (_no_version_at_all, "plan"),
    "job_code_hash_not_hex": (_code_hash("agent_started", "A" * 64), "payload"),
    "step_code_hash_not_text": (_code_hash("step_called", 7), "payload"),
    "created_as_plan_job": (_not_an_agent_job, "plan"),
    "plan_in_agent_job": (_plan_too, "plan"),
    "event_before_its_call": (_event_before_its_call, "node_in_plan"),
    "commit_deleted": (_drop("command_committed", 1), "commit_evidence"),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_and_resealed_log_fails_replay_proof(store: Store, case: str) -> None:
    edit, expected = FORGED[case]
    log = refund_agent_log()
    events = copy.deepcopy(log.events)
    edit(log, events)
    job_id = store_log(store, log, events=events, status="completed")
    result = verify_job(store, job_id)
    assert result.stored_chain.ok and result.seal.ok  # the forger re-chained and re-sealed
    assert not result.replay_proof_result.ok, case
    assert invariant(result) == expected, result.replay_proof_result.error
    assert not result.ok


def test_agent_events_in_a_plan_job() -> None:
    job_id, plan_events = synthetic_log()
    for event in (
        {"type": "step_called", "payload": {"seq": 0, "node_id": "#0"}},
        {"type": "agent_started", "payload": {"agent": "a", "agent_version": "1"}},
    ):
        events = [*plan_events[:2], event, *plan_events[2:]]
        listed = [
            {"version": v, "event_id": e, "type": t, "payload": p, "chain_hash": h}
            for v, e, t, p, h in rows(events)
        ]
        result = verify_events(listed, job_id=job_id, status="completed")
        assert invariant(result) == "plan", result.replay_proof_result.error
        assert result.replay_proof_result.version == 3
