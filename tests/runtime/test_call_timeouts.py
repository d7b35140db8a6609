"""Per-call timeouts (docs/runtime.md, "Timeouts"): a call past its time limit has an unknown
outcome. It is resolved by the tool's reconcile hook, tried again only for a tool declared
idempotent, else the job parks — never a blind retry of a payment; the abandoned call's late
end changes nothing recorded; the offline verifier refuses a retry the log does not allow.
A worker killed right after a timeout repeats nothing. Both backends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.verify import verify_job
from affidavit.verify.verification import verify_event_rows
from tests.runtime.crash_tools import REGISTRY as CRASH_TOOLS
from tests.runtime.crash_tools import counts
from tests.runtime.helpers import assert_log_sound, of_type, run_driver
from tests.runtime.timeout_tools import REGISTRY, effects, one_call
from tests.verify.helpers import rows


def released(where: Path) -> None:
    """Let the abandoned call end, and wait until it has (bounded)."""
    (where / "go").touch()
    end = time.monotonic() + 30
    while not (where / "returned").exists():
        assert time.monotonic() < end, "the abandoned call did not end"
        time.sleep(0.02)
    time.sleep(0.1)  # (its done-callback runs right after it returns)


@pytest.mark.parametrize("how", ["node", "tool_default", "agent_call"])
def test_a_timed_out_payment_parks_and_is_not_repeated(
    store_url: str, tmp_path: Path, how: str
) -> None:
    """Not idempotent, no reconcile hook: the call stays open and the job parks ``in_flight``
    (effect counter 1); the call's late result is ignored — the log and the job are as they
    were; ``resume retry`` (a person's word that it did not act) runs it again."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        if how == "agent_call":
            job_id = rt.submit("to_agent", {"dir": str(tmp_path)}).job_id
        elif how == "tool_default":
            job_id = rt.submit(one_call("to_pay_default", tmp_path, None), {}).job_id
        else:
            job_id = rt.submit(one_call("to_pay", tmp_path), {}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "parked"
        assert len(effects(tmp_path)) == 1
        events = assert_log_sound(rt.store, job_id)
        assert of_type(events, "tool_invocation_finished") == []
        [started] = of_type(events, "tool_invocation_started")
        assert started["timeout_seconds"] == 0.3 and "idempotent" not in started
        [parked] = of_type(events, "job_parked")
        assert parked["reason"] == "in_flight"
        assert parked["idempotency_key"] == started["idempotency_key"]
        assert parked["detail"]["timeout_seconds"] == 0.3
        assert "not declared idempotent" in parked["detail"]["message"]
        assert verify_job(rt.store, job_id).ok
        before = [e.event_id for e in rt.store.list_events(job_id)]
        released(tmp_path)  # the late result
        assert [e.event_id for e in rt.store.list_events(job_id)] == before
        assert rt.get_job(job_id).status == "parked"
        rt.resume(job_id, "retry")
        (tmp_path / "returned").unlink()
        rt.run_until_idle()  # (the gate is open: the second try answers)
        assert rt.get_job(job_id).status == "completed"
        assert len(effects(tmp_path)) == 2
        assert verify_job(rt.store, job_id).ok


def test_an_idempotent_call_is_tried_again_after_its_timeout(
    store_url: str, tmp_path: Path
) -> None:
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_id = rt.submit(one_call("to_put", tmp_path, None), {}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        assert len(effects(tmp_path)) == 2  # safe to repeat, and repeated
        events = assert_log_sound(rt.store, job_id)
        first, second = of_type(events, "tool_invocation_started")
        assert first["idempotent"] is True and first["timeout_seconds"] == 0.3
        timed_out, done = of_type(events, "tool_invocation_finished")
        assert timed_out["outcome"] == "timeout" and timed_out["resolution"] == "retry"
        assert timed_out["timeout_seconds"] == 0.3
        assert timed_out["error"]["type"] == "CallTimedOut"
        assert done["outcome"] == "success"
        assert first["idempotency_key"] == second["idempotency_key"]
        assert verify_job(rt.store, job_id).ok
        released(tmp_path)
        assert rt.get_job(job_id).status == "completed"
        assert verify_job(rt.store, job_id).ok


def test_a_timed_out_call_is_resolved_by_its_reconcile_hook(store_url: str, tmp_path: Path) -> None:
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_id = rt.submit(one_call("to_pay_found", tmp_path), {}).job_id
        rt.run_until_idle()
        job = rt.get_job(job_id)
        assert job.status == "completed"
        [done] = effects(tmp_path)
        events = assert_log_sound(rt.store, job_id)
        assert len(of_type(events, "tool_invocation_started")) == 1
        [finished] = of_type(events, "tool_invocation_finished")
        assert finished["outcome"] == "success" and finished["catch_up"] is True
        assert finished["resolution"] == "reconcile" and finished["timeout_seconds"] == 0.3
        assert finished["result"] == {"effect": done["key"]}
        assert verify_job(rt.store, job_id).ok
        released(tmp_path)  # the late result does not overwrite the recorded one
        assert [e.event_id for e in rt.store.list_events(job_id)] == [e.event_id for e in events]
        assert len(effects(tmp_path)) == 1


def test_a_timed_out_call_its_hook_finds_nothing_of_is_tried_again(
    store_url: str, tmp_path: Path
) -> None:
    """Nothing found: the call is closed as ``lost`` (the hook's answer is the evidence) and
    the next try, with the same external key, acts."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_id = rt.submit(one_call("to_slow_found", tmp_path), {}).job_id
        rt.run_until_idle()
        assert rt.get_job(job_id).status == "completed"
        [done] = effects(tmp_path)
        events = assert_log_sound(rt.store, job_id)
        first, second = of_type(events, "tool_invocation_started")
        lost, success = of_type(events, "tool_invocation_finished")
        assert lost["outcome"] == "lost" and lost["resolution"] == "reconcile"
        assert lost["invocation_id"] == first["invocation_id"]
        assert success["outcome"] == "success" and success["result"] == {"effect": done["key"]}
        assert success["invocation_id"] == second["invocation_id"]
        assert verify_job(rt.store, job_id).ok
        released(tmp_path)
        assert len(effects(tmp_path)) == 1


def _log(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    return [{"type": e.type, "payload": e.payload} for e in rt.store.list_events(job_id)]


def test_verify_refuses_a_retry_after_a_timeout_without_idempotent(
    store_url: str, tmp_path: Path
) -> None:
    """The idempotent tool's log, its declaration taken out and the chain recomputed: a
    timed-out call that was then run again fails verification; the log as written passes."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_id = rt.submit(one_call("to_put", tmp_path, None), {}).job_id
        rt.run_until_idle()
        log = _log(rt, job_id)
    released(tmp_path)
    assert verify_event_rows(job_id, rows(log), status="completed").replay_proof_result.ok
    for e in log:
        if e["type"] == "tool_invocation_started":
            del e["payload"]["idempotent"]
    odd = verify_event_rows(job_id, rows(log), status="completed").replay_proof_result
    assert not odd.ok and odd.invariant == "closing_rule", odd.error
    assert "resolution 'retry'" in odd.error  # a retry resolution needs the declaration
    for e in log:  # the closing written without its resolution: the retry itself is refused
        if e["type"] == "tool_invocation_finished" and e["payload"]["outcome"] == "timeout":
            del e["payload"]["resolution"], e["payload"]["timeout_seconds"]
    blind = verify_event_rows(job_id, rows(log), status="completed").replay_proof_result
    assert not blind.ok and blind.invariant == "closing_rule", blind.error
    assert "not declared idempotent" in blind.error


@pytest.mark.parametrize("tool_name", ["crash_slow_charge_nr", "crash_slow_charge"])
def test_a_worker_killed_right_after_a_timeout_repeats_nothing(
    store_url: str, tmp_path: Path, tool_name: str
) -> None:
    """SIGKILL after the call timed out, before its resolution is written: the invocation is
    open, and the next worker resolves it as any in flight — the reconcile hook finds the
    charge (committed), or the job parks. The charge happened once either way."""
    side = tmp_path / "side.jsonl"
    call = {
        "id": "pay",
        "type": "tool",
        "tool": tool_name,
        "args": {"side": "${input.side}", "amount": 5, "delay": 3600},
        "timeout_seconds": 0.3,
    }
    graph = {"name": "killed", "retry": {"max_attempts": 3, "backoff_seconds": 0}, "nodes": [call]}
    with Runtime(store_url, tools=CRASH_TOOLS) as rt:
        job_id = rt.submit(graph, {"side": str(side)}).job_id
        died = run_driver(store_url, "--job", job_id, "--lease", "1", crash="tool.after_timeout")
        assert died.returncode != 0
        assert of_type(rt.store.list_events(job_id), "tool_invocation_finished") == []
        again = run_driver(store_url, "--until-done", "--lease", "1")
        assert again.returncode == 0, again.stderr
        job = rt.get_job(job_id)
        assert counts(side, "charge")[(job_id, "pay")] == 1
        events = assert_log_sound(rt.store, job_id)
        if tool_name == "crash_slow_charge":
            assert job.status == "completed"
            [finished] = of_type(events, "tool_invocation_finished")
            assert finished["outcome"] == "success" and finished["catch_up"] is True
        else:
            assert job.status == "parked"
            assert of_type(events, "job_parked")[0]["reason"] == "in_flight"
        assert verify_job(rt.store, job_id).ok
