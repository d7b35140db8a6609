"""verify_job on real jobs of every status, on both backends."""

from __future__ import annotations

import base64
import gc
import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from affidavit import (
    JobNotFound,
    Runtime,
    SigningKey,
    Tool,
    ToolContext,
    verify_events,
    verify_job,
)
from affidavit.core.canonical import canonical, parse
from affidavit.record._replay import build_from_events
from affidavit.runtime._sdk import CompensatableError, RetryableError
from affidavit.verify._fold import LogFold
from affidavit.verify.verification import seal_document
from tests.cli.test_cli import cli, json_of
from tests.runtime.helpers import ledger_rows, wait_lease_expired
from tests.verify.helpers import (
    SECTION6_KEYS,
    TWO_CHARGES,
    RawDb,
    charge_tool,
    crash_in_flight,
    park_in_flight,
    plan,
    tools,
    waiting_job,
)


def assert_all_ok(result: Any) -> None:
    assert result.ok, result.checks()
    assert result.replay_proof_result.error == ""


def test_completed_job_verifies_and_matches_a_hand_computed_chain(
    refunded: tuple[Runtime, str], raw: RawDb
) -> None:
    rt, job_id = refunded
    result = verify_job(rt.store, job_id)
    assert_all_ok(result)
    doc = result.to_dict()
    assert list(doc) == SECTION6_KEYS
    assert doc["tool_invocation_ledger_proof"] == {"ok": True, "pending_idempotency_keys": []}
    assert doc["replay_proof_result"] == {"ok": True, "error": ""}

    # docs/formats.md §4 by hand, from the raw rows: raw previous digest, "\n", id, " ", type, " ",
    # standard padded base64 of the stored bytes.
    rows = raw.events(job_id)
    head = b""
    for version, event_id, event_type, payload, stored in rows:
        text = f"\n{event_id} {event_type} {base64.b64encode(payload).decode()}"
        head = hashlib.sha256(head + text.encode()).digest()
        assert stored == head.hex(), f"stored hash of version {version}"
    assert doc["event_chain_root_hash"] == head.hex()
    assert doc["stored_chain"] == {"ok": True, "first_bad_version": None, "event_count": len(rows)}

    # docs/formats.md §5 by hand.
    events = rt.store.list_events(job_id)
    [plan_event] = [e.payload for e in events if e.type == "plan_generated"]
    assert (
        plan_event["plan_hash"] == hashlib.sha256(canonical(plan_event["task_graph"])).hexdigest()
    )
    text = plan_event["plan_hash"] + "".join(
        f"{e.payload['node_id']}:{e.payload['result_type']}\n"
        for e in events
        if e.type == "node_finished"
    )
    assert doc["execution_hash"] == hashlib.sha256(text.encode()).hexdigest()

    # The seal by hand: Ed25519 over JCS of the v2 fields, with the recorded public key; the
    # events root is RFC 6962's MTH over the raw chain hashes (defined recursively here).
    seal = rt.store.get_seal(job_id)
    assert seal is not None and seal.version == 2
    [key] = [k for k in rt.store.signing_keys() if k.key_id == seal.key_id]
    assert seal.key_id == hashlib.sha256(key.public_key).hexdigest()[:16]

    def mth(leaves: list[bytes]) -> bytes:
        if len(leaves) == 1:
            return hashlib.sha256(b"\x00" + leaves[0]).digest()
        k = 1 << ((len(leaves) - 1).bit_length() - 1)
        return hashlib.sha256(b"\x01" + mth(leaves[:k]) + mth(leaves[k:])).digest()

    assert seal.events_root == mth([bytes.fromhex(r[4]) for r in rows]).hex()
    message = canonical(
        {
            "version": 2,
            "job_id": job_id,
            "event_count": len(rows),
            "event_chain_root_hash": head.hex(),
            "events_root": seal.events_root,
            "sealed_at": seal.sealed_at,
            "key_id": seal.key_id,
        }
    )
    Ed25519PublicKey.from_public_bytes(key.public_key).verify(
        base64.b64decode(seal.signature), message
    )
    assert doc["seal"] == {
        "present": True,
        "ok": True,
        "key_id": seal.key_id,
        "event_count": len(rows),
        "error": "",
        "codes": [],
    }


def test_verification_changes_nothing(refunded: tuple[Runtime, str], raw: RawDb) -> None:
    rt, job_id = refunded
    tables = ("jobs", "events", "tool_invocations", "seals", "signing_keys")
    before = {t: sorted(map(repr, raw.rows(f"SELECT * FROM {t}"))) for t in tables}
    for _ in range(2):
        verify_job(rt.store, job_id)
    assert {t: sorted(map(repr, raw.rows(f"SELECT * FROM {t}"))) for t in tables} == before


def test_unknown_job(refunded: tuple[Runtime, str]) -> None:
    rt, _ = refunded
    with pytest.raises(JobNotFound):
        verify_job(rt.store, "no-such-job")
    assert gc.isenabled()  # the collector paused for the call is back on after the error


def test_job_id_that_is_not_unicode_text_is_not_found(refunded: tuple[Runtime, str]) -> None:
    """A command line that is not UTF-8 reaches Python as lone surrogates; no job has such an
    id (a job id is text), so the job is not found — not a traceback, whose exit code 1 reads
    as "a proof failed"."""
    rt, _ = refunded
    with pytest.raises(JobNotFound):
        verify_job(rt.store, "\udcff")
    result = cli("verify", "\udcff", "--db", rt.store.url, "--json")
    assert result.returncode == 2, result.stderr
    assert json_of(result)["error"]["code"] == "job_not_found"


def test_job_id_with_a_nul_is_not_found(refunded: tuple[Runtime, str]) -> None:
    """As for `Store.get_job` (PostgreSQL refuses a NUL in a query: a store error otherwise)."""
    rt, job_id = refunded
    with pytest.raises(JobNotFound):
        verify_job(rt.store, job_id + "\x00")
    with pytest.raises(JobNotFound):
        seal_document(rt.store, job_id + "\x00")


def test_verification_restores_the_garbage_collector(
    refunded: tuple[Runtime, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cyclic collector is paused while the log is folded (no cycles, many objects) and
    on again afterwards."""
    rt, job_id = refunded
    seen: list[bool] = []
    feed_all = LogFold.feed_all

    def spy(self: LogFold, rows: Any, parsed: Any = None) -> None:
        seen.append(gc.isenabled())
        feed_all(self, rows, parsed)

    monkeypatch.setattr(LogFold, "feed_all", spy)
    assert verify_job(rt.store, job_id).ok
    assert seen == [False]
    assert gc.isenabled()
    events = rt.store.list_events(job_id)
    seal = rt.store.get_seal(job_id)
    assert verify_events(events, public_keys=rt.store.signing_keys(), seal=seal).ok
    assert seen == [False, False]
    assert gc.isenabled()


def test_failed_and_cancelled_jobs_are_sealed_and_verify(
    make_runtime: Callable[..., Runtime],
) -> None:
    rt = make_runtime(tools(charge_tool("declined", fail=True)))
    failing = rt.submit(
        plan(
            {"id": "a", "type": "tool", "tool": "charge", "args": {"amount": 1}},
            {"id": "b", "type": "tool", "tool": "declined", "depends_on": ["a"]},
        )
    ).job_id
    cancelled = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
    rt.cancel(cancelled, reason="not needed", by="test")
    rt.run_until_idle()
    for job_id, status in ((failing, "failed"), (cancelled, "cancelled")):
        assert rt.get_job(job_id).status == status
        result = verify_job(rt.store, job_id)
        assert_all_ok(result)
        assert result.seal.present and result.seal.event_count == result.stored_chain.event_count


def test_compensated_job_verifies_and_its_compensation_is_required(
    make_runtime: Callable[..., Runtime], raw: RawDb
) -> None:
    """A compensated tool node counts as completed: only with the step_compensated that
    follows its compensatable_failure (the log re-chained without it fails the replay)."""

    def book(ctx: ToolContext, seats: int) -> None:
        raise CompensatableError(f"booked {seats - 1} of {seats} seats")

    def undo(ctx: ToolContext, seats: int) -> dict[str, Any]:
        return {"released": seats - 1}

    rt = make_runtime(tools(Tool("book", book, "tool", compensate_fn=undo)))
    job_id = rt.submit(
        plan({"id": "bk", "type": "tool", "tool": "book", "args": {"seats": 3}})
    ).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "failed"
    assert_all_ok(verify_job(rt.store, job_id))
    events = raw.events(job_id)
    [(at, *_)] = [e for e in events if e[2] == "step_compensated"]
    raw.rewrite_log(job_id, [(e, t, p) for v, e, t, p, _ in events if v != at])
    result = verify_job(rt.store, job_id)
    assert result.stored_chain.ok
    assert result.replay_proof_result.invariant == "commit_evidence"
    assert result.replay_proof_result.version == at  # the compensated finish, now one earlier
    assert "compensated without a step_compensated" in result.replay_proof_result.error


def retried_job(make_runtime: Callable[..., Runtime]) -> tuple[Runtime, str]:
    """A completed job of one tool step that failed once (retryably) and succeeded on its
    retry."""
    tries: list[str] = []

    def flaky(ctx: ToolContext) -> dict[str, Any]:
        tries.append(ctx.idempotency_key)
        if len(tries) == 1:
            raise RetryableError("busy")
        return {"ok": len(tries)}

    rt = make_runtime(tools(Tool("flaky", flaky, "tool")))
    job_plan = plan(
        {"id": "f", "type": "tool", "tool": "flaky", "args": {}},
        retry={"max_attempts": 2, "backoff_seconds": 0},
    )
    job_id = rt.submit(job_plan).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed" and len(tries) == 2
    return rt, job_id


def test_a_failed_try_made_a_success_is_refused(
    make_runtime: Callable[..., Runtime], raw: RawDb
) -> None:
    """A tool step that failed once and succeeded on its retry; the failed try's outcome
    rewritten to a success (re-chained): a success the runtime would have committed with it,
    and the key started again — the replay proof fails at the retry's start."""
    rt, job_id = retried_job(make_runtime)
    assert_all_ok(verify_job(rt.store, job_id))
    events = raw.events(job_id)
    finishes = [v for v, _, t, _, _ in events if t == "tool_invocation_finished"]
    rewritten = []
    for version, event_id, event_type, payload, _ in events:
        if version == finishes[0]:
            failed = parse(payload)
            assert failed["outcome"] == "failure"
            del failed["error"]
            payload = canonical({**failed, "outcome": "success", "result": {"ok": 1}})
        rewritten.append((event_id, event_type, payload))
    raw.rewrite_log(job_id, rewritten)
    result = verify_job(rt.store, job_id)
    assert result.stored_chain.ok
    assert result.replay_proof_result.invariant == "commit_evidence"
    retry = [v for v, _, t, _, _ in events if t == "tool_invocation_started"][1]
    assert result.replay_proof_result.version == retry
    assert "succeeded at version" in result.replay_proof_result.error


@pytest.mark.parametrize(
    ("field", "value", "invariant", "at"),
    [("tool_name", "charge", "node_in_plan", 0), ("args_hash", "0" * 16, "closing_rule", 1)],
)
def test_a_failed_try_of_another_tool_or_with_other_arguments_is_refused(
    make_runtime: Callable[..., Runtime],
    raw: RawDb,
    field: str,
    value: str,
    invariant: str,
    at: int,
) -> None:
    """The ledger row names the tool and arguments hash of its key's latest try only; an
    earlier try rewritten to another tool of the registry fails where it starts (a node invokes
    the tool its plan names), one with another arguments hash where the key starts again."""
    rt, job_id = retried_job(make_runtime)
    events = raw.events(job_id)
    starts = [v for v, _, t, _, _ in events if t == "tool_invocation_started"]
    rewritten = []
    for version, event_id, event_type, payload, _ in events:
        if version == starts[0]:
            payload = canonical({**parse(payload), field: value})
        rewritten.append((event_id, event_type, payload))
    raw.rewrite_log(job_id, rewritten)
    result = verify_job(rt.store, job_id)
    assert result.stored_chain.ok
    assert result.replay_proof_result.invariant == invariant, result.replay_proof_result.error
    assert result.replay_proof_result.version == starts[at]


def test_job_in_flight_reports_its_pending_key_and_passes(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running with an open invocation (T1 committed, the worker died): the key is listed as
    pending, nothing fails — the chain is intact and the job is not terminal, so no seal."""
    rt = make_runtime(tools())
    job_id = crash_in_flight(rt, monkeypatch, TWO_CHARGES)
    [row] = ledger_rows(rt.store, job_id)
    assert row.status == "started"

    result = verify_job(rt.store, job_id)
    assert_all_ok(result)
    assert result.status == "running"
    assert result.tool_invocation_ledger_proof.pending_idempotency_keys == (row.idempotency_key,)
    assert result.stored_chain.ok and result.stored_chain.first_bad_version is None
    assert result.seal.to_dict() == {
        "present": False,
        "ok": True,
        "key_id": None,
        "event_count": None,
        "error": "",
        "codes": [],
    }
    replay = build_from_events(rt.store.list_events(job_id))
    assert set(replay.pending_tool_invocations) == {row.idempotency_key}


def test_parked_job_reports_pending_then_resumed_job_verifies(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = make_runtime(tools())
    job_id = park_in_flight(rt, monkeypatch, TWO_CHARGES)
    [row] = ledger_rows(rt.store, job_id)
    parked = verify_job(rt.store, job_id)
    assert_all_ok(parked)
    assert parked.status == "parked"
    assert parked.tool_invocation_ledger_proof.pending_idempotency_keys == (row.idempotency_key,)
    assert not parked.seal.present

    rt.resume(job_id, "accept_result", result={"charged": 4, "key": "found by a person"})
    rt.run_until_idle()
    done = verify_job(rt.store, job_id)
    assert rt.get_job(job_id).status == "completed"
    assert_all_ok(done)
    assert done.tool_invocation_ledger_proof.pending_idempotency_keys == ()
    assert done.seal.present


def test_resume_fail_seals_the_failed_job(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = make_runtime(tools())
    job_id = park_in_flight(rt, monkeypatch, TWO_CHARGES)
    rt.resume(job_id, "fail", by="operator")
    result = verify_job(rt.store, job_id)
    assert result.status == "failed"
    assert_all_ok(result)
    assert result.seal.present


def test_in_flight_policy_fail_seals_the_failed_job(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = make_runtime(tools())
    job_id = crash_in_flight(rt, monkeypatch, {**TWO_CHARGES, "in_flight": "fail"})
    wait_lease_expired(rt.store, job_id)
    rt.run_until_idle()
    result = verify_job(rt.store, job_id)
    assert result.status == "failed"
    assert_all_ok(result)
    assert result.seal.present


def test_waiting_job_verifies(make_runtime: Callable[..., Runtime]) -> None:
    rt = make_runtime(tools())
    job_id = waiting_job(rt)
    result = verify_job(rt.store, job_id)
    assert_all_ok(result)
    assert result.status == "waiting" and not result.seal.present


def test_agrees_with_the_runtime_replay(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verifier's own streaming fold and the runtime's replay context read the same log
    the same way: status and pending keys agree."""
    rt = make_runtime(tools())
    in_flight = crash_in_flight(rt, monkeypatch, TWO_CHARGES)
    done = rt.submit(TWO_CHARGES, {"amount": 3}).job_id
    wait_lease_expired(rt.store, in_flight)
    rt.run_until_idle()
    for job_id in (in_flight, done):
        result = verify_job(rt.store, job_id)
        replay = build_from_events(rt.store.list_events(job_id))
        assert result.status == replay.status == rt.get_job(job_id).status
        assert set(result.tool_invocation_ledger_proof.pending_idempotency_keys) == set(
            replay.pending_tool_invocations
        )


def exported(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    """The events as `affidavit jobs events --json` prints them (payload decoded)."""
    return [{"job_id": job_id, **e.to_dict()} for e in rt.store.list_events(job_id)]


def test_verify_events_offline_equals_verify_job(refunded: tuple[Runtime, str]) -> None:
    rt, job_id = refunded
    seal = rt.store.get_seal(job_id)
    assert seal is not None
    keys = [k.public_key_b64 for k in rt.store.signing_keys()]
    offline = verify_events(
        exported(rt, job_id),
        seal=seal.to_dict(),
        public_keys=keys,
        ledger=ledger_rows(rt.store, job_id),
        status="completed",
    )
    assert offline.to_dict() == verify_job(rt.store, job_id).to_dict()
    # The stored rows themselves (bytes, no re-serialization) give the same answer.
    assert (
        verify_events(rt.store.list_events(job_id), seal=seal, public_keys=keys).to_dict()
        == offline.to_dict()
    )


def test_verify_events_needs_the_public_key_and_the_seal(refunded: tuple[Runtime, str]) -> None:
    rt, job_id = refunded
    seal = rt.store.get_seal(job_id)
    assert seal is not None
    no_key = verify_events(exported(rt, job_id), seal=seal)
    assert not no_key.ok and not no_key.seal.ok
    assert "unknown key" in no_key.seal.error
    no_seal = verify_events(
        exported(rt, job_id), public_keys=[k.public_key_b64 for k in rt.store.signing_keys()]
    )
    assert no_seal.status == "completed" and no_seal.seal.to_dict()["present"] is False
    assert not no_seal.ok


def test_trusted_keys_pin_the_signer(refunded: tuple[Runtime, str]) -> None:
    rt, job_id = refunded
    seal = rt.store.get_seal(job_id)
    assert seal is not None
    assert verify_job(rt.store, job_id, trusted_keys=[seal.key_id]).ok
    [recorded] = rt.store.signing_keys()
    assert verify_job(rt.store, job_id, trusted_keys=[recorded.public_key_b64]).ok
    stranger = SigningKey.generate()
    pinned = verify_job(rt.store, job_id, trusted_keys=[stranger.public_raw])
    assert not pinned.ok and "unknown key" in pinned.seal.error


def test_explicit_signing_key_is_used(make_runtime: Callable[..., Runtime], tmp_path: Path) -> None:
    key = SigningKey.generate()
    rt = make_runtime(tools(), signing_key=key)
    job_id = rt.submit(TWO_CHARGES, {"amount": 1}).job_id
    rt.run_until_idle()
    seal = rt.store.get_seal(job_id)
    assert seal is not None and seal.key_id == key.key_id
    assert verify_job(rt.store, job_id, trusted_keys=[key.public_raw]).ok


def test_verifying_while_the_job_runs(make_runtime: Callable[..., Runtime]) -> None:
    """Verification reads one snapshot: run after run of it while a worker appends events and
    commits ledger rows never sees the log and the ledger disagree, and the finished job then
    verifies with its seal."""
    rt = make_runtime(tools())
    nodes = [{"id": "n0", "type": "tool", "tool": "charge", "args": {"amount": 0}}]
    for i in range(1, 25):
        nodes.append(
            {
                "id": f"n{i}",
                "type": "tool",
                "tool": "charge",
                "args": {"amount": i},
                "depends_on": [f"n{i - 1}"],
            }
        )
    job_id = rt.submit(plan(*nodes), {}).job_id
    worker = threading.Thread(target=rt.run_until_idle)
    worker.start()
    seen: list[int] = []
    try:
        while True:
            result = verify_job(rt.store, job_id)
            assert result.ok, result.checks()
            seen.append(result.stored_chain.event_count)
            if result.status == "completed":
                break
    finally:
        worker.join()
    assert seen == sorted(seen)  # every snapshot is a prefix of the next
    assert result.seal.present and result.seal.event_count == seen[-1]


# --- fields of the rare events, rewritten and re-chained ------------------------------------------


def rewrite(raw: RawDb, job_id: str, event_type: str, **fields: Any) -> int:
    """Re-chain the job's log with ``fields`` set in its (first) ``event_type`` payload (a
    value ``None`` removes the field); the version of that event."""
    events = raw.events(job_id)
    at = next(v for v, _, t, _, _ in events if t == event_type)
    rewritten = []
    for version, event_id, kind, payload, _ in events:
        if version == at:
            edited = parse(payload)
            for name, value in fields.items():
                if value is None:
                    edited.pop(name, None)
                else:
                    edited[name] = value
            payload = canonical(edited)
        rewritten.append((event_id, kind, payload))
    raw.rewrite_log(job_id, rewritten)
    return at


def refused(result: Any, invariant: str, version: int, words: str) -> None:
    proof = result.replay_proof_result
    assert result.stored_chain.ok
    assert (proof.invariant, proof.version) == (invariant, version), proof.error
    assert words in proof.error


@pytest.mark.parametrize(("wait_type", "node_type"), [("signal", "approval"), ("approval", "wait")])
def test_job_waiting_wait_type_is_its_nodes_type(
    make_runtime: Callable[..., Runtime], raw: RawDb, wait_type: str, node_type: str
) -> None:
    rt = make_runtime(tools())
    job_id = rt.submit(plan({"id": "w", "type": node_type})).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "waiting"
    assert_all_ok(verify_job(rt.store, job_id))
    at = rewrite(raw, job_id, "job_waiting", wait_type=wait_type)
    refused(verify_job(rt.store, job_id), "node_in_plan", at, f"not {wait_type!r}")


def test_job_failed_names_a_node_of_the_plan(
    make_runtime: Callable[..., Runtime], raw: RawDb
) -> None:
    rt = make_runtime(tools(charge_tool("declined", fail=True)))
    job_id = rt.submit(plan({"id": "a", "type": "tool", "tool": "declined"})).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "failed"
    assert_all_ok(verify_job(rt.store, job_id))
    at = rewrite(raw, job_id, "job_failed", node_id="nowhere")
    refused(verify_job(rt.store, job_id), "node_in_plan", at, "'nowhere' is not in the plan")


def test_job_parked_in_flight_names_an_open_key_of_its_node(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch, raw: RawDb
) -> None:
    rt = make_runtime(tools())
    job_id = park_in_flight(rt, monkeypatch, TWO_CHARGES)
    assert_all_ok(verify_job(rt.store, job_id))
    at = rewrite(raw, job_id, "job_parked", idempotency_key="0" * 64)
    refused(verify_job(rt.store, job_id), "closing_rule", at, "not an open invocation of node")


@pytest.mark.parametrize(
    ("decision", "result", "words"),
    [
        ("continue", None, "'continue' does not resolve a park for 'in_flight'"),
        ("fast_forward", None, "'fast_forward' does not resolve"),
        ("retry", {"charged": 1}, "a result goes only with accept_result"),
    ],
)
def test_job_resumed_decision_resolves_its_parks_reason(
    make_runtime: Callable[..., Runtime],
    monkeypatch: pytest.MonkeyPatch,
    raw: RawDb,
    decision: str,
    result: Any,
    words: str,
) -> None:
    rt = make_runtime(tools())
    job_id = park_in_flight(rt, monkeypatch, TWO_CHARGES)
    rt.resume(job_id, "retry")
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "completed"
    assert_all_ok(verify_job(rt.store, job_id))
    at = rewrite(raw, job_id, "job_resumed", decision=decision, result=result)
    refused(verify_job(rt.store, job_id), "closing_rule", at, words)


def accepted_job(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch
) -> tuple[Runtime, str, dict[str, Any]]:
    """A one-step job parked in flight, resumed with `accept_result` and completed: the
    accepted result is committed (and is the job's output)."""
    rt = make_runtime(tools())
    one = plan({"id": "a", "type": "tool", "tool": "charge", "args": {"amount": 4}})
    job_id = park_in_flight(rt, monkeypatch, one)
    accepted = {"charged": 4, "key": "found by a person"}
    rt.resume(job_id, "accept_result", result=accepted)
    rt.run_until_idle()
    assert rt.get_job(job_id).output == {"a": accepted}
    assert_all_ok(verify_job(rt.store, job_id))
    return rt, job_id, accepted


def test_job_resumed_accepted_result_is_the_one_committed(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch, raw: RawDb
) -> None:
    rt, job_id, _ = accepted_job(make_runtime, monkeypatch)
    at = rewrite(raw, job_id, "job_resumed", result={"charged": 5})
    refused(verify_job(rt.store, job_id), "commit_evidence", at, "accepted result is not")


def forge_output(raw: RawDb, job_id: str, output: Any) -> int:
    """The job_completed output rewritten (re-chained), and the job row's output with it."""
    at = rewrite(raw, job_id, "job_completed", output=output)
    raw.execute("UPDATE jobs SET output = ? WHERE job_id = ?", (canonical(output).decode(), job_id))
    return at


class _AnyKey:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith("affidavit:")


ANY_KEY: Any = _AnyKey()


@pytest.mark.parametrize(
    ("output", "words"),
    [
        ({"b": {"charged": 200, "key": "forged"}}, "of node 'b' is not its committed result"),
        ({"a": {"charged": 3}}, "not the sink nodes ['b']"),
        ({}, "not the sink nodes ['b']"),
        ([], "the job output is not an object"),
    ],
)
def test_job_output_is_its_sink_nodes_committed_results(
    make_runtime: Callable[..., Runtime], raw: RawDb, output: Any, words: str
) -> None:
    """The job output maps each sink node to its output (FORMATS §3): a tool sink's is its
    committed result. Rewritten in job_completed and the job row alike, it fails."""
    rt = make_runtime(tools())
    job_id = rt.submit(TWO_CHARGES, {"amount": 3}).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).output == {"b": {"charged": 2, "key": ANY_KEY}}
    assert_all_ok(verify_job(rt.store, job_id))
    at = forge_output(raw, job_id, output)
    refused(verify_job(rt.store, job_id), "after_terminal", at, words)


def test_job_output_of_an_approval_is_its_signal_payload(
    make_runtime: Callable[..., Runtime], raw: RawDb
) -> None:
    rt = make_runtime(tools())
    job_id = waiting_job(rt)
    rt.signal(job_id, f"{job_id}:ok", {"approved": True, "comment": "ann"}, approver="ann")
    rt.run_until_idle()
    assert rt.get_job(job_id).output == {"ok": {"approved": True, "comment": "ann"}}
    assert_all_ok(verify_job(rt.store, job_id))
    at = forge_output(raw, job_id, {"ok": {"approved": True, "comment": "bob"}})
    refused(verify_job(rt.store, job_id), "after_terminal", at, "is not its signal payload")


def test_job_output_after_accept_result_is_the_accepted_result(
    make_runtime: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch, raw: RawDb
) -> None:
    """`resume --decision accept_result` commits the person's result: the tool sink's output."""
    rt, job_id, _ = accepted_job(make_runtime, monkeypatch)
    at = forge_output(raw, job_id, {"a": {"charged": 5}})
    refused(verify_job(rt.store, job_id), "after_terminal", at, "not its committed result")


def test_job_output_of_a_pure_sink_is_its_recorded_output(
    make_runtime: Callable[..., Runtime], raw: RawDb
) -> None:
    def double(ctx: ToolContext, n: int) -> dict[str, Any]:
        return {"total": n * 2}

    rt = make_runtime(tools(Tool("double", double, "pure")))
    job_id = rt.submit(plan({"id": "t", "type": "pure", "tool": "double", "args": {"n": 2}})).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).output == {"t": {"total": 4}}
    assert_all_ok(verify_job(rt.store, job_id))
    at = forge_output(raw, job_id, {"t": {"total": 999}})
    refused(verify_job(rt.store, job_id), "after_terminal", at, "not its recorded output")
