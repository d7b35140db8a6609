"""The replay proof's invariants, each broken in an otherwise well-formed, correctly chained
export of a real job: the error names the invariant and the version of the first violation."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime, verify_events
from affidavit.core.canonical import canonical
from affidavit.core.chain import GENESIS, chain_next
from affidavit.examples import refund
from affidavit.record._replay import ReplayContextBuilder, ReplayError
from affidavit.store import StoredEvent
from tests.verify.helpers import refund_job

Event = dict[str, Any]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Event]]:
    """One completed refund job's events, as `affidavit jobs events --json` prints them (the
    fold is store-independent; the store-level checks run on both backends elsewhere)."""
    tmp = tmp_path_factory.mktemp("invariants")
    with Runtime(f"sqlite:///{tmp / 'a.db'}", tools=refund.TOOLS, signing_key=tmp / "k") as rt:
        job_id = refund_job(rt, tmp / "shop")
        yield [{"job_id": job_id, **e.to_dict()} for e in rt.store.list_events(job_id)]


def rechain(events: list[Event]) -> list[Event]:
    """Renumber and re-chain (what a forger can always do): only the invariants can tell."""
    head = GENESIS
    out = []
    for version, e in enumerate(events, start=1):
        payload = e["payload"] if isinstance(e["payload"], bytes) else canonical(e["payload"])
        head = chain_next(head, e["event_id"], e["type"], payload)
        out.append({**e, "version": version, "chain_hash": head.hex()})
    return out


def index(events: list[Event], event_type: str, node_id: str | None = None, nth: int = 0) -> int:
    found = [
        i
        for i, e in enumerate(events)
        if e["type"] == event_type
        and (
            node_id is None
            or (isinstance(e["payload"], dict) and e["payload"].get("node_id") == node_id)
        )
    ]
    return found[nth]


def check(events: list[Event], invariant: str, version: int, **kw: Any) -> Any:
    result = verify_events(rechain(events), **kw)
    assert result.stored_chain.ok
    assert not result.replay_proof_result.ok
    assert result.replay_proof_result.invariant == invariant, result.replay_proof_result.error
    assert result.replay_proof_result.version == version
    assert result.replay_proof_result.error.startswith(f"{invariant} at version {version}: ")
    return result


Mutation = Callable[[list[Event]], tuple[str, int]]


def dependency_skipped(ev: list[Event]) -> tuple[str, int]:
    del ev[index(ev, "node_finished", "lookup")]
    return "dependencies_first", index(ev, "node_started", "decide") + 1


def node_not_in_plan(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_started", "decide")
    ev[i]["payload"]["node_id"] = "ghost"
    return "node_in_plan", i + 1


def wrong_step_id(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_finished", "decide")
    ev[i]["payload"]["step_id"] = "0000000000000000"
    return "node_in_plan", i + 1


def executed_after_commit(ev: list[Event]) -> tuple[str, int]:
    started = copy.deepcopy(ev[index(ev, "tool_invocation_started", "lookup")])
    started["event_id"] = "forged-1"
    started["payload"]["invocation_id"] = "forged-invocation"
    i = index(ev, "job_completed")
    ev.insert(i, started)
    return "committed_once", i + 1


def result_hash_forged(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "command_committed", "refund")
    ev[i]["payload"]["result_hash"] = "0" * 64
    return "commit_evidence", i + 1


def committed_without_commit(ev: list[Event]) -> tuple[str, int]:
    del ev[index(ev, "command_committed", "lookup")]
    return "commit_evidence", index(ev, "node_finished", "lookup") + 1


def pure_step_rerun(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_finished", "decide")
    again = copy.deepcopy(ev[i])
    again["event_id"] = "forged-2"
    ev.insert(i + 1, again)
    return "not_rerun", i + 2


def event_after_terminal(ev: list[Event]) -> tuple[str, int]:
    extra = copy.deepcopy(ev[index(ev, "node_started", "email")])
    extra["event_id"] = "forged-3"
    ev.append(extra)
    return "after_terminal", len(ev)


def completed_without_all_nodes(ev: list[Event]) -> tuple[str, int]:
    first = index(ev, "node_started", "email")
    last = index(ev, "node_finished", "email")
    del ev[first : last + 1]
    return "after_terminal", index(ev, "job_completed") + 1


def plan_hash_forged(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "plan_generated")
    ev[i]["payload"]["plan_hash"] = "f" * 64
    return "plan", i + 1


def plan_hash_not_a_string(ev: list[Event]) -> tuple[str, int]:
    """Not absent (then it is recomputed from the task graph): null, or an object."""
    i = index(ev, "plan_generated")
    ev[i]["payload"]["plan_hash"] = None
    return "plan", i + 1


def plan_hash_an_object(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "plan_generated")
    ev[i]["payload"]["plan_hash"] = {"sha256": ev[i]["payload"]["plan_hash"]}
    return "plan", i + 1


def finished_twice(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "tool_invocation_finished", "email")
    again = copy.deepcopy(ev[i])
    again["event_id"] = "forged-4"
    ev.insert(i + 1, again)
    return "closing_rule", i + 2


def finished_without_start(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "tool_invocation_finished", "lookup")
    ev[i]["payload"]["invocation_id"] = "never-started"
    return "closing_rule", i + 1


def unknown_type(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_started", "email")
    ev[i]["type"] = "node_teleported"
    return "payload", i + 1


def payload_not_an_object(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_started", "email")
    ev[i]["payload"] = b"[1,2,3]"
    return "payload", i + 1


def before_terminal(ev: list[Event], event_type: str, payload: dict[str, Any]) -> int:
    """Insert an event just before the terminal one; return its index."""
    i = index(ev, "job_completed")
    extra = copy.deepcopy(ev[i])
    extra.update(event_id=f"forged-{event_type}", type=event_type, payload=payload)
    ev.insert(i, extra)
    return i


def tool_node_invoked_after_it_completed(ev: list[Event]) -> tuple[str, int]:
    """A completed tool node calls its tool again under a new key: a second side effect."""
    i = index(ev, "node_finished", "lookup")
    started = copy.deepcopy(ev[index(ev, "tool_invocation_started", "lookup")])
    started["event_id"] = "forged-5"
    started["payload"].update(idempotency_key="f" * 64, invocation_id="again")
    ev.insert(i + 1, started)
    return "not_rerun", i + 2


def finished_under_another_node(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "tool_invocation_finished", "email")
    lookup = ev[index(ev, "node_started", "lookup")]["payload"]
    ev[i]["payload"].update(node_id="lookup", step_id=lookup["step_id"])
    return "closing_rule", i + 1


def key_invoked_by_two_nodes(ev: list[Event]) -> tuple[str, int]:
    """refund tries a key that fails; then email starts an invocation under that same key."""
    i = index(ev, "tool_invocation_started", "refund")
    started, finished = copy.deepcopy(ev[i]), copy.deepcopy(ev[i + 1])
    for e, n in ((started, 6), (finished, 7)):
        e["event_id"] = f"forged-{n}"
        e["payload"].update(idempotency_key="d" * 64, invocation_id="failed-try")
    finished["payload"].update(outcome="failure", error={"type": "x", "message": "x"})
    finished["payload"].pop("result", None)
    ev[i:i] = [started, finished]
    j = index(ev, "tool_invocation_started", "email")
    again = copy.deepcopy(ev[j])
    again["event_id"] = "forged-8"
    again["payload"].update(idempotency_key="d" * 64, invocation_id="other")
    ev.insert(j, again)
    return "closing_rule", j + 1


def second_job_created(ev: list[Event]) -> tuple[str, int]:
    again = copy.deepcopy(ev[0])
    again["event_id"] = "forged-9"
    ev.insert(5, again)
    return "plan", 6


def no_job_created(ev: list[Event]) -> tuple[str, int]:
    del ev[0]
    return "plan", 1


def resumed_while_not_parked(ev: list[Event]) -> tuple[str, int]:
    payload = {"at": "x", "decision": "accept_result", "result": {}, "by": "me", "note": ""}
    return "closing_rule", before_terminal(ev, "job_resumed", payload) + 1


def wait_completed_for_no_wait(ev: list[Event]) -> tuple[str, int]:
    payload = {"at": "x", "node_id": "decide", "correlation_key": "k", "payload": {}}
    return "closing_rule", before_terminal(
        ev, "wait_completed", payload | {"signalled_by": "me"}
    ) + 1


def waiting_on_a_node_not_in_the_plan(ev: list[Event]) -> tuple[str, int]:
    payload = {"at": "x", "node_id": "ghost", "wait_type": "signal", "correlation_key": "k"}
    return "node_in_plan", before_terminal(ev, "job_waiting", payload | {"reason": ""}) + 1


def parked_on_a_node_not_in_the_plan(ev: list[Event]) -> tuple[str, int]:
    payload = {"at": "x", "reason": "in_flight", "node_id": "ghost", "detail": {}}
    return "node_in_plan", before_terminal(ev, "job_parked", payload) + 1


def state_changed_on_a_pure_node(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_finished", "decide")
    changed = copy.deepcopy(ev[i])
    changed.update(event_id="forged-10", type="state_changed")
    changed["payload"] = {
        "at": "x",
        "node_id": "decide",
        "step_id": ev[i]["payload"]["step_id"],
        "state_changes": [{"resource_type": "payment", "resource_id": "P", "operation": "x"}],
    }
    ev.insert(i, changed)
    return "node_in_plan", i + 1


def event_of_another_job(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_started", "decide")
    for e in ev[i:]:
        e["job_id"] = "another-job"
    return "payload", i + 1


def commit_under_another_node(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "command_committed", "email")
    refund = ev[index(ev, "node_started", "refund")]["payload"]
    ev[i]["payload"].update(node_id="refund", step_id=refund["step_id"])
    return "commit_evidence", i + 1


def payload_nested_too_deeply(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_started", "email")
    ev[i]["payload"] = b'{"at":"x","deep":' + b"[" * 1000 + b"]" * 1000 + b"}"
    return "payload", i + 1


def tool_node_finished_as_pure(ev: list[Event]) -> tuple[str, int]:
    """A tool node that completes as a pure step needs no commit: its side effect unproven."""
    i = index(ev, "node_finished", "refund")
    ev[i]["payload"]["result_type"] = "pure"
    return "commit_evidence", i + 1


def tool_node_compensated_without_compensation(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_finished", "refund")
    ev[i]["payload"]["result_type"] = "compensated"
    return "commit_evidence", i + 1


def pure_node_finished_as_compensated(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "node_finished", "decide")
    ev[i]["payload"]["result_type"] = "compensated"
    return "node_in_plan", i + 1


def compensation_without_a_compensatable_failure(ev: list[Event]) -> tuple[str, int]:
    """A step_compensated and a compensated finish instead of the commit's node_finished: no
    compensatable_failure came before."""
    i = index(ev, "node_finished", "email")
    compensated = copy.deepcopy(ev[i])
    compensated.update(event_id="forged-11", type="step_compensated")
    compensated["payload"] = {
        "at": "x",
        "node_id": "email",
        "step_id": ev[i]["payload"]["step_id"],
        "compensation": {},
    }
    ev[i]["payload"]["result_type"] = "compensated"
    ev.insert(i, compensated)
    return "commit_evidence", i + 1


def success_never_committed_then_retried(ev: list[Event]) -> tuple[str, int]:
    """A first try of email's key that succeeded, then a second try of the key: the runtime
    writes a success and its commit in one transaction, so the first success went uncommitted."""
    i = index(ev, "tool_invocation_started", "email")
    tried = copy.deepcopy(ev[i : i + 2])
    for n, e in enumerate(tried):
        e["event_id"] = f"forged-try-{n}"
        e["payload"]["invocation_id"] = "first-try"
    ev[i:i] = tried
    return "commit_evidence", i + 3


def log_ends_after_an_uncommitted_success(ev: list[Event]) -> tuple[str, int]:
    """A log cut between a success and its commit (a job in flight, truncated)."""
    i = index(ev, "tool_invocation_finished", "email")
    del ev[i + 1 :]
    return "commit_evidence", i + 1


def another_tool_invoked(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "tool_invocation_started", "refund")
    ev[i]["payload"]["tool_name"] = ev[index(ev, "tool_invocation_started", "email")]["payload"][
        "tool_name"
    ]
    return "node_in_plan", i + 1


def key_retried_with_other_arguments(ev: list[Event]) -> tuple[str, int]:
    """A failed first try of email's key with other arguments: the key hashes the arguments,
    so every try of a key has the same args_hash."""
    i = index(ev, "tool_invocation_started", "email")
    tried = copy.deepcopy(ev[i : i + 2])
    for n, e in enumerate(tried):
        e["event_id"] = f"forged-args-{n}"
        e["payload"]["invocation_id"] = "first-try"
    tried[0]["payload"]["args_hash"] = "0" * 16
    tried[1]["payload"].update(outcome="failure", error={"type": "x", "message": "x"})
    tried[1]["payload"].pop("result", None)
    ev[i:i] = tried
    return "closing_rule", i + 3


def job_failed_on_a_node_not_in_the_plan(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "job_completed")
    ev[i]["type"] = "job_failed"
    ev[i]["payload"] = {"at": "x", "error": {"type": "x", "message": "x"}, "node_id": "ghost"}
    return "node_in_plan", i + 1


def parked_in_flight_on_a_committed_key(ev: list[Event]) -> tuple[str, int]:
    started = ev[index(ev, "tool_invocation_started", "email")]["payload"]
    payload = {
        "at": "x",
        "reason": "in_flight",
        "node_id": "email",
        "step_id": started["step_id"],
        "idempotency_key": started["idempotency_key"],
        "detail": {},
    }
    return "closing_rule", before_terminal(ev, "job_parked", payload) + 1


def resumed_with_a_decision_its_park_does_not_take(ev: list[Event]) -> tuple[str, int]:
    parked = {"at": "x", "reason": "replay_verification", "node_id": "email", "detail": {}}
    resumed = {"at": "x", "decision": "retry", "result": None, "by": "me", "note": ""}
    before_terminal(ev, "job_parked", parked)
    return "closing_rule", before_terminal(ev, "job_resumed", resumed) + 1


def job_output_forged(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "job_completed")
    ev[i]["payload"]["output"]["email"] = {"sent": "forged"}
    return "after_terminal", i + 1


def job_output_without_its_sink(ev: list[Event]) -> tuple[str, int]:
    i = index(ev, "job_completed")
    ev[i]["payload"]["output"] = {"refund": ev[i]["payload"]["output"]["email"]}
    return "after_terminal", i + 1


RARE_EVENT_MUTATIONS = [
    job_failed_on_a_node_not_in_the_plan,
    parked_in_flight_on_a_committed_key,
    resumed_with_a_decision_its_park_does_not_take,
    job_output_forged,
    job_output_without_its_sink,
]


RESULT_TYPE_MUTATIONS = [
    another_tool_invoked,
    key_retried_with_other_arguments,
    success_never_committed_then_retried,
    log_ends_after_an_uncommitted_success,
    tool_node_finished_as_pure,
    tool_node_compensated_without_compensation,
    pure_node_finished_as_compensated,
    compensation_without_a_compensatable_failure,
]


NEW_MUTATIONS = [
    tool_node_invoked_after_it_completed,
    finished_under_another_node,
    key_invoked_by_two_nodes,
    second_job_created,
    no_job_created,
    resumed_while_not_parked,
    wait_completed_for_no_wait,
    waiting_on_a_node_not_in_the_plan,
    parked_on_a_node_not_in_the_plan,
    state_changed_on_a_pure_node,
    event_of_another_job,
]


@pytest.mark.parametrize(
    "mutate",
    [
        dependency_skipped,
        node_not_in_plan,
        wrong_step_id,
        executed_after_commit,
        result_hash_forged,
        committed_without_commit,
        pure_step_rerun,
        event_after_terminal,
        completed_without_all_nodes,
        plan_hash_forged,
        plan_hash_not_a_string,
        plan_hash_an_object,
        finished_twice,
        finished_without_start,
        unknown_type,
        payload_not_an_object,
        *NEW_MUTATIONS,
        commit_under_another_node,
        payload_nested_too_deeply,
        *RESULT_TYPE_MUTATIONS,
        *RARE_EVENT_MUTATIONS,
    ],
)
def test_violation_is_named_with_its_version(exported: list[Event], mutate: Mutation) -> None:
    events = copy.deepcopy(exported)
    invariant, version = mutate(events)
    check(events, invariant, version)


MUTATIONS_THE_RUNTIME_CHECKS = [
    dependency_skipped,
    node_not_in_plan,
    wrong_step_id,
    executed_after_commit,
    committed_without_commit,
    pure_step_rerun,
    event_after_terminal,
    finished_twice,
    finished_without_start,
    unknown_type,
    *NEW_MUTATIONS,
    commit_under_another_node,
]


@pytest.mark.parametrize("mutate", MUTATIONS_THE_RUNTIME_CHECKS)
def test_the_runtime_replay_refuses_the_same_event(exported: list[Event], mutate: Mutation) -> None:
    """The runtime's replay builder (which refuses impossible logs before it resumes a job)
    and the verifier's fold name the same first bad event. The fold checks more besides: the
    result hashes, the plan hash, that a completed job completed every node."""
    events = copy.deepcopy(exported)
    _, version = mutate(events)
    stored = [
        StoredEvent(
            e["job_id"],
            e["version"],
            e["event_id"],
            e["type"],
            e["payload"] if isinstance(e["payload"], bytes) else canonical(e["payload"]),
            e["chain_hash"],
        )
        for e in rechain(events)
    ]
    with pytest.raises(ReplayError) as refused:
        ReplayContextBuilder.build_from_events(stored)
    assert refused.value.version == version


def test_ledger_proof_flags_closing_rule_breaches(exported: list[Event]) -> None:
    for mutate in (finished_twice, finished_without_start):
        events = copy.deepcopy(exported)
        mutate(events)
        ledger = verify_events(rechain(events)).tool_invocation_ledger_proof
        assert not ledger.ok and ledger.errors


def test_terminal_job_with_an_open_invocation(exported: list[Event]) -> None:
    """The job "fails" while the email invocation is still open: ledger proof fails and lists
    the key; the same log without the terminal event is simply in flight."""
    events = copy.deepcopy(exported)
    cut = index(events, "tool_invocation_started", "email") + 1
    key = events[cut - 1]["payload"]["idempotency_key"]
    failed = copy.deepcopy(events[-1])
    failed.update(type="job_failed", payload={"at": failed["payload"]["at"], "error": "x"})
    in_flight = verify_events(rechain(events[:cut]))
    assert in_flight.ok and in_flight.status == "running"
    assert in_flight.tool_invocation_ledger_proof.pending_idempotency_keys == (key,)
    terminal = verify_events(rechain([*events[:cut], failed]))
    ledger = terminal.tool_invocation_ledger_proof
    assert not ledger.ok and ledger.pending_idempotency_keys == (key,)
    assert ledger.errors == ("the job is failed but 1 invocation(s) were never closed",)


def test_malformed_exports_fail_closed(exported: list[Event]) -> None:
    from affidavit import VerificationError

    with pytest.raises(VerificationError, match="lacks 'type'"):
        verify_events([{k: v for k, v in exported[0].items() if k != "type"}])
    with pytest.raises(VerificationError, match="no job id"):
        verify_events([])
    with pytest.raises(VerificationError, match="malformed seal"):
        verify_events(exported, seal={"job_id": "x"})
    nan = {**exported[0], "payload": {"x": float("nan")}}
    with pytest.raises(VerificationError, match="payload"):
        verify_events([nan])


def test_vector_formulas_through_verify_events(exported: list[Event]) -> None:
    """docs/formats.md §10: chain root and execution hash of the minimal vector events."""
    import json

    vectors = json.loads((Path(__file__).parents[1] / "vectors" / "formats_v1.json").read_text())
    chain = [
        {"version": i, "event_id": e, "type": t, "payload": p, "chain_hash": None}
        for i, (e, t, p) in enumerate(vectors["chain"]["events"], start=1)
    ]
    result = verify_events(chain, job_id=vectors["job_id"])
    assert result.event_chain_root_hash == vectors["chain"]["root"]
    assert result.stored_chain.first_bad_version == 1  # no stored hashes were given
    decide = {
        "version": 4,
        "event_id": "e4",
        "type": "node_finished",
        "payload": {"node_id": "decide", "result_type": "pure"},
    }
    result = verify_events([*chain, decide], job_id=vectors["job_id"])
    assert result.execution_hash == vectors["execution_hash"]["expected"]


def test_truncated_export_with_its_claimed_status(exported: list[Event]) -> None:
    """Cut off before the terminal event, an export looks in flight; told the job completed,
    the verifier fails it (status against the log, and a completed job needs a seal)."""
    cut = exported[:-1]
    assert verify_events(cut).status == "running" and verify_events(cut).ok
    claimed = verify_events(cut, status="completed")
    assert not claimed.ok
    assert claimed.replay_proof_result.invariant == "status"
    assert claimed.seal.error == "the job is completed but has no seal"


def test_an_absent_plan_hash_is_recomputed(exported: list[Event]) -> None:
    """FORMATS §5: the plan hash is recomputed from the task graph when absent — the replay
    proof and the execution hash are those of the log with it."""
    events = copy.deepcopy(exported)
    del events[index(events, "plan_generated")]["payload"]["plan_hash"]
    result = verify_events(rechain(events))
    assert result.replay_proof_result.ok, result.replay_proof_result.error
    assert result.execution_hash == verify_events(exported).execution_hash
