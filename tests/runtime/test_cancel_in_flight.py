"""A cancel never records ``lost`` for an effect that happened (G2, G9): a cancel that meets a
tool call in flight lets it finish and records its real outcome, then the job ends cancelled;
a call whose worker died is resolved by the tool's reconcile hook or parked, never closed as
lost; ``--force`` abandons it as ``unknown``. Real worker subprocesses, both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from affidavit import Runtime
from affidavit.packs import export_pack, verify_pack
from affidavit.record import job_trace
from affidavit.store import Store
from affidavit.verify import verify_job
from tests.cli.test_cli import cli, cli_env, json_of
from tests.runtime.cancel_tools import REGISTRY, effects, one_step, two_steps
from tests.runtime.helpers import assert_log_sound, of_type

TOOLS = str(Path(__file__).with_name("cancel_tools.py"))


def worker(url: str, lease: float = 2.0) -> subprocess.Popen[str]:
    """``affidavit worker --until-idle`` on ``url``, as a real process."""
    return subprocess.Popen(
        [sys.executable, "-m", "affidavit", "worker", "--tools", TOOLS, "--until-idle",
         "--lease-seconds", str(lease), "--db", url, "--json"],
        env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(what: str, check: Callable[[], object], proc: subprocess.Popen[str] | None) -> None:
    """Poll ``check`` (a condition another process makes true) for up to 60 s."""
    end = time.monotonic() + 60
    while not check():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the worker exited before {what}: {proc.communicate()}")
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def finish(proc: subprocess.Popen[str]) -> None:
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def outcomes(store: Store, job_id: str) -> list[str]:
    """The outcome of every tool_invocation_finished, in log order."""
    return [p["outcome"] for p in of_type(store.list_events(job_id), "tool_invocation_finished")]


def lease_expired(store: Store, job_id: str) -> Callable[[], bool]:
    def expired() -> bool:
        expires = store.get_job(job_id).lease_expires_at
        return expires is not None and expires < time.time()

    return expired


def verify_cli(url: str, job_id: str) -> dict[str, Any]:
    r = cli("verify", job_id, "--db", url, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


@pytest.mark.parametrize("shape", ["plan", "one_step", "agent"])
def test_a_cancel_lets_the_call_in_flight_finish_and_records_it(
    store_url: str, tmp_path: Path, shape: str
) -> None:
    """`affidavit cancel` while a worker process is inside a tool call: the cancel records a
    request and says so; the call finishes and is recorded committed with its result; the next
    step never starts (nor does the job complete); the job ends cancelled and `affidavit
    verify` passes. A plan with a step after the call, one without, and an agent job."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        if shape == "agent":
            job = rt.submit("cancel_agent", {"dir": str(tmp_path)})
        else:
            make = two_steps if shape == "plan" else one_step
            job = rt.submit(make("cancel_slow", tmp_path), {})
        proc = worker(store_url)
        try:
            wait_for("the call", (tmp_path / "started").exists, proc)
            r = cli("cancel", job.job_id, "--reason", "not needed", "--db", store_url, "--json")
            assert r.returncode == 0, r.stderr
            doc = json_of(r)
            assert doc["status"] == "running"
            assert doc["cancel"]["state"] == "requested"
            assert doc["cancel"]["waiting_on"] == "in_flight"
            assert len(doc["cancel"]["in_flight"]) == 1
            assert "will finish" in doc["cancel"]["message"]
            assert outcomes(rt.store, job.job_id) == []  # nothing was closed by the cancel
            (tmp_path / "go").touch()
            finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        ended = rt.get_job(job.job_id)
        assert ended.status == "cancelled"
        done = effects(tmp_path)
        assert len(done) == 1  # it happened once; the next call never ran
        assert outcomes(rt.store, job.job_id) == ["success"]
        with rt.store.transaction() as tx:
            row = tx.ledger_get(job.job_id, tx.ledger_list(job.job_id)[0].idempotency_key)
        assert row is not None and row.status == "committed"
        assert row.result == {"effect": done[0]["key"]}
        events = assert_log_sound(rt.store, job.job_id)
        assert of_type(events, "job_cancelled")[0]["reason"] == "not needed"
        assert len(of_type(events, "tool_invocation_started")) == 1
        assert not of_type(events, "job_completed")
        assert verify_job(rt.store, job.job_id).ok
    report = verify_cli(store_url, job.job_id)
    assert "unknown_outcome_keys" not in report["tool_invocation_ledger_proof"]


def test_a_cancel_of_a_dead_workers_call_asks_reconcile(store_url: str, tmp_path: Path) -> None:
    """The worker is SIGKILLed after its tool acted; its lease expires; Runtime.cancel resolves
    the call through the tool's reconcile hook (the effect is found: committed, as a catch-up),
    starts nothing else, and the job ends cancelled."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        job = rt.submit(two_steps("cancel_acts_then_hangs", tmp_path), {})
        proc = worker(store_url, lease=1.0)
        wait_for("the call", (tmp_path / "started").exists, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        wait_for("the dead lease", lease_expired(rt.store, job.job_id), None)
        ended = rt.cancel(job.job_id, reason="stop")
        assert ended.status == "cancelled"
        assert [e["node"] for e in effects(tmp_path)] == ["first"]
        assert outcomes(rt.store, job.job_id) == ["success"]
        events = assert_log_sound(rt.store, job.job_id)
        finished = of_type(events, "tool_invocation_finished")[0]
        assert finished["catch_up"] is True  # found by reconcile, not run again
        assert verify_job(rt.store, job.job_id).ok


def test_a_cancel_of_a_dead_workers_call_without_reconcile_parks_then_force_is_unknown(
    store_url: str, tmp_path: Path
) -> None:
    """Without a reconcile hook the call in flight cannot be resolved: after the cancel the next
    worker parks the job on it (the default in-flight policy) — the invocation stays open,
    never lost — and the job waits for a person. `cancel --force` then closes it as `unknown`:
    verify passes and reports it as of unknown outcome, and the trace shows it."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        job = rt.submit(two_steps("cancel_acts_then_hangs_nr", tmp_path), {})
        proc = worker(store_url, lease=1.0)
        wait_for("the call", (tmp_path / "started").exists, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        r = cli("cancel", job.job_id, "--db", store_url)  # (the words a person reads)
        assert r.returncode == 0, r.stderr
        said = " ".join(r.stderr.split())
        assert f"cancel requested for job {job.job_id} (now running)" in said, said
        assert "cancel_acts_then_hangs_nr (node 'first'" in said and "--force" in said
        assert f"job {job.job_id}: running" in said
        wait_for("the dead lease", lease_expired(rt.store, job.job_id), None)
        finish(worker(store_url))  # recovers the job: parks it on the call in flight
        parked = rt.get_job(job.job_id)
        assert parked.status == "parked"
        assert outcomes(rt.store, job.job_id) == []  # open: neither lost nor anything else
        assert verify_job(rt.store, job.job_id).ok
        r = cli("cancel", job.job_id, "--force", "--db", store_url, "--json")
        assert r.returncode == 0, r.stderr
        doc = json_of(r)
        assert doc["status"] == "cancelled" and doc["cancel"]["state"] == "cancelled"
        assert [c["node_id"] for c in doc["cancel"]["abandoned"]] == ["first"]
        assert outcomes(rt.store, job.job_id) == ["unknown"]
        assert_log_sound(rt.store, job.job_id)
        result = verify_job(rt.store, job.job_id)
        assert result.ok
        key = rt.store.list_events(job.job_id)[-2].payload["idempotency_key"]
        assert result.tool_invocation_ledger_proof.unknown_outcome_keys == (key,)
        assert "unknown outcome" in result.checks()[2].detail
        trace = job_trace(rt.store, job.job_id)
        assert [n["state"] for n in trace["nodes"]] == ["unknown", "skipped"]
    report = verify_cli(store_url, job.job_id)
    assert report["tool_invocation_ledger_proof"]["unknown_outcome_keys"] == [key]


@pytest.mark.parametrize("shape", ["plan", "agent"])
def test_cancel_force_abandons_a_live_call_as_unknown(
    store_url: str, tmp_path: Path, shape: str
) -> None:
    """`cancel --force` while the call runs: the job is cancelled at once and the call recorded
    as `unknown` — the effect then happens (the worker was inside the tool), and the record
    never said it did not; the worker's late outcome is fenced off; the trace shows the step
    as unknown and the pack verifies offline."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        if shape == "agent":
            job = rt.submit("cancel_agent", {"dir": str(tmp_path)})
        else:
            job = rt.submit(two_steps("cancel_slow", tmp_path), {})
        proc = worker(store_url)
        try:
            wait_for("the call", (tmp_path / "started").exists, proc)
            ended = rt.cancel(job.job_id, force=True)
            assert ended.status == "cancelled"
            (tmp_path / "go").touch()
            finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert len(effects(tmp_path)) == 1  # the abandoned call acted; nothing else ran
        assert outcomes(rt.store, job.job_id) == ["unknown"]
        assert "lost" not in outcomes(rt.store, job.job_id)
        assert_log_sound(rt.store, job.job_id)
        result = verify_job(rt.store, job.job_id)
        assert result.ok and len(result.tool_invocation_ledger_proof.unknown_outcome_keys) == 1
        states = [n["state"] for n in job_trace(rt.store, job.job_id)["nodes"]]
        assert states[0] == "unknown" and "side_effect_committed" not in states
        pack = export_pack(rt.store, job.job_id, tmp_path / "pack")  # and offline, as a pack
        assert verify_pack(pack.pack_dir).verdict == "MATCH"


def test_a_cancel_with_nothing_in_flight_cancels_at_once(store_url: str, tmp_path: Path) -> None:
    """A pending job and a waiting job are cancelled at once, as before (sealed, verified)."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        pending = rt.submit(two_steps("cancel_quick", tmp_path), {})
        waits = rt.submit(
            {"name": "waits", "nodes": [{"id": "w", "type": "wait"}]}, {}, idempotency_key="w"
        )
        assert rt.run_job(waits.job_id).status == "waiting"
        for job in (pending, waits):
            assert rt.cancel(job.job_id, reason="no").status == "cancelled"
            assert verify_job(rt.store, job.job_id).ok
            assert outcomes(rt.store, job.job_id) == []
        assert effects(tmp_path) == []


def test_cancel_wait_returns_once_the_job_has_ended(store_url: str, tmp_path: Path) -> None:
    """`affidavit cancel --wait` records the request, then waits while the call finishes and
    returns the job once it has ended cancelled."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        job = rt.submit(two_steps("cancel_slow", tmp_path), {})
        proc = worker(store_url)
        waiting: subprocess.Popen[str] | None = None
        try:
            wait_for("the call", (tmp_path / "started").exists, proc)
            waiting = subprocess.Popen(
                [sys.executable, "-m", "affidavit", "cancel", job.job_id, "--wait",
                 "--timeout", "60", "--db", store_url, "--json"],
                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip

            def requested() -> bool:
                with rt.store.transaction() as tx:
                    return tx.cancel_request(job.job_id) is not None

            wait_for("the cancel request", requested, waiting)
            assert waiting.poll() is None  # still waiting: the call has not finished
            (tmp_path / "go").touch()
            out, err = waiting.communicate(timeout=60)
            assert waiting.returncode == 0, err
            finish(proc)
        finally:
            for p in (proc, waiting):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.communicate()
        doc = json.loads(out)
        assert doc["status"] == "cancelled" and doc["cancel"]["state"] == "requested"
        assert outcomes(rt.store, job.job_id) == ["success"]
        assert verify_job(rt.store, job.job_id).ok


def _killed_in_flight(rt: Runtime, store_url: str, tmp_path: Path, plan: dict[str, Any]) -> str:
    """A job whose worker process was SIGKILLed after its call acted; its lease has expired."""
    job = rt.submit(plan, {})
    proc = worker(store_url, lease=1.0)
    wait_for("the call", (tmp_path / "started").exists, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    wait_for("the dead lease", lease_expired(rt.store, job.job_id), None)
    return job.job_id


def test_a_cancel_under_the_fail_policy_fails_the_job_with_the_call_unknown(
    store_url: str, tmp_path: Path
) -> None:
    """No reconcile hook and `in_flight: fail`: the recovery the cancel triggers fails the job
    loudly, the call closed as `unknown` (it did act), never as lost."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        plan = two_steps("cancel_acts_then_hangs_nr", tmp_path, in_flight="fail")
        job_id = _killed_in_flight(rt, store_url, tmp_path, plan)
        assert rt.cancel(job_id).status == "failed"
        assert len(effects(tmp_path)) == 1
        assert outcomes(rt.store, job_id) == ["unknown"]
        assert_log_sound(rt.store, job_id)
        result = verify_job(rt.store, job_id)
        assert result.ok and len(result.tool_invocation_ledger_proof.unknown_outcome_keys) == 1


def test_a_requested_cancel_of_a_parked_job_ends_after_the_persons_decision(
    store_url: str, tmp_path: Path
) -> None:
    """Parked on the call (no reconcile hook) with a cancel requested: a person checks the world
    and accepts the result; the job then ends cancelled with the call committed as that
    result, and the step after it never runs."""
    with Runtime(store_url, tools=REGISTRY) as rt:
        job_id = _killed_in_flight(rt, store_url, tmp_path, two_steps("cancel_acts_then_hangs_nr",
                                                                      tmp_path))  # fmt: skip
        assert rt.cancel(job_id, reason="stop").status == "parked"  # resolved here: it parks
        [effect] = effects(tmp_path)
        rt.resume(job_id, "accept_result", result={"effect": effect["key"]}, by="ops")
        assert rt.run_job(job_id).status == "cancelled"
        assert len(effects(tmp_path)) == 1
        assert outcomes(rt.store, job_id) == ["success"]
        events = assert_log_sound(rt.store, job_id)
        assert of_type(events, "job_cancelled")[0]["reason"] == "stop"
        assert verify_job(rt.store, job_id).ok
