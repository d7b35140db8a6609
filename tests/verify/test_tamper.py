"""The tamper corpus: each case edits a finished job's database directly, as someone with
write access could, and must be caught by the check the case names."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from affidavit import Runtime, SigningKey, verify_job
from affidavit.core.canonical import canonical, canonical_sha256, parse
from affidavit.core.ids import new_event_id
from affidavit.core.seal import events_root
from affidavit.packs import export_pack, verify_pack
from affidavit.record._sealing import default_key_path
from affidavit.verify import VerificationResult
from tests.verify.helpers import RawDb, charge_tool, plan, tools

Refunded = tuple[Runtime, str]


def failing_checks(result: VerificationResult) -> set[str]:
    return {c.name for c in result.checks() if not c.ok}


def version_of(raw: RawDb, job_id: str, event_type: str, nth: int = 0) -> int:
    return [v for v, _, t, _, _ in raw.events(job_id) if t == event_type][nth]


def test_untouched_job_verifies(refunded: Refunded) -> None:
    rt, job_id = refunded
    assert verify_job(rt.store, job_id).ok


def test_flip_one_byte_of_a_payload(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    version = version_of(raw, job_id, "tool_invocation_finished", 1)  # the refund's result
    payload = bytearray(raw.events(job_id)[version - 1][3])
    at = payload.index(b'"amount":') + len(b'"amount":')
    payload[at] ^= 0x01  # 4200 -> 5200: still valid JSON, a different amount
    raw.set_payload(job_id, version, bytes(payload))
    result = verify_job(rt.store, job_id)
    assert "stored_chain" in failing_checks(result)
    assert result.stored_chain.first_bad_version == version


def test_change_an_events_type(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    version = version_of(raw, job_id, "node_started", 2)
    raw.execute(
        "UPDATE events SET type = 'confirmation_warning' WHERE job_id = ? AND version = ?",
        (job_id, version),
    )
    result = verify_job(rt.store, job_id)
    assert "stored_chain" in failing_checks(result)
    assert result.stored_chain.first_bad_version == version


def test_delete_an_event(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    version = version_of(raw, job_id, "command_committed")
    raw.execute("DELETE FROM events WHERE job_id = ? AND version = ?", (job_id, version))
    result = verify_job(rt.store, job_id)
    assert "stored_chain" in failing_checks(result)
    assert result.stored_chain.first_bad_version == version
    assert result.stored_chain.event_count == len(raw.events(job_id))


def test_swap_two_events(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    a = version_of(raw, job_id, "node_finished", 0)
    b = version_of(raw, job_id, "node_finished", 1)
    raw.execute("UPDATE events SET version = -1 WHERE job_id = ? AND version = ?", (job_id, a))
    raw.execute("UPDATE events SET version = ? WHERE job_id = ? AND version = ?", (a, job_id, b))
    raw.execute("UPDATE events SET version = ? WHERE job_id = ? AND version = -1", (b, job_id))
    result = verify_job(rt.store, job_id)
    assert "stored_chain" in failing_checks(result)
    assert result.stored_chain.first_bad_version == a


def test_insert_a_forged_event_and_rechain_the_rest(refunded: Refunded, raw: RawDb) -> None:
    """A forger inserts a state change and recomputes every later hash: the stored chain is
    consistent again, but the seal fixed the length and the root."""
    rt, job_id = refunded
    events = [(e, t, p) for _, e, t, p, _ in raw.events(job_id)]
    at = version_of(raw, job_id, "node_finished", 2) - 1
    refund_started = parse(events[at - 1][2])
    forged = {
        "at": refund_started["at"],
        "node_id": refund_started["node_id"],
        "step_id": refund_started["step_id"],
        "state_changes": [
            {"resource_type": "payment", "resource_id": "P-1", "operation": "refund"}
        ],
    }
    events.insert(at, (new_event_id(), "state_changed", canonical(forged)))
    raw.rewrite_log(job_id, events)
    result = verify_job(rt.store, job_id)
    assert result.stored_chain.ok  # the chain alone cannot tell
    assert result.replay_proof_result.ok  # a plausible event
    assert failing_checks(result) == {"seal"}
    assert "covers" in result.seal.error


def test_truncate_the_tail(refunded: Refunded, raw: RawDb) -> None:
    """Dropping the last events leaves a valid prefix chain; the seal knows the length."""
    rt, job_id = refunded
    n = len(raw.events(job_id))
    raw.execute("DELETE FROM events WHERE job_id = ? AND version > ?", (job_id, n - 3))
    result = verify_job(rt.store, job_id)
    assert result.stored_chain.ok
    assert "seal" in failing_checks(result)
    assert result.seal.error == f"the seal covers {n} events, the log has {n - 3}"


def test_truncate_the_tail_and_recompute(refunded: Refunded, raw: RawDb) -> None:
    """Truncated to just before the terminal event and re-chained, with the job row put back
    to running (and its output cleared): every log-internal check passes, only the seal tells."""
    rt, job_id = refunded
    events = [(e, t, p) for _, e, t, p, _ in raw.events(job_id)][:-1]
    raw.rewrite_log(job_id, events)
    raw.execute("UPDATE jobs SET status = 'running', output = NULL WHERE job_id = ?", (job_id,))
    result = verify_job(rt.store, job_id)
    assert result.stored_chain.ok and result.replay_proof_result.ok
    assert failing_checks(result) == {"seal"}


def test_rechain_the_whole_log(refunded: Refunded, raw: RawDb) -> None:
    """Change the refund's recorded result everywhere it appears — the finished event, the
    result hash in command_committed, the ledger row — then re-chain the whole log from
    scratch: log and ledger are consistent, the seal's root is not."""
    rt, job_id = refunded
    events = []
    new_result = None
    for _, event_id, event_type, payload_bytes, _ in raw.events(job_id):
        payload = parse(payload_bytes)
        if event_type == "tool_invocation_finished" and payload["node_id"] == "refund":
            payload["result"]["amount"] = 1
            new_result = payload["result"]
        if event_type == "command_committed" and payload["node_id"] == "refund":
            payload["result_hash"] = canonical_sha256(new_result)
        events.append((event_id, event_type, canonical(payload)))
    raw.rewrite_log(job_id, events)
    raw.execute(
        "UPDATE tool_invocations SET result = ? WHERE job_id = ? AND node_id = 'refund'",
        (canonical(new_result).decode(), job_id),
    )
    result = verify_job(rt.store, job_id)
    assert result.stored_chain.ok
    assert result.tool_invocation_ledger_proof.ok and result.replay_proof_result.ok
    assert failing_checks(result) == {"seal"}
    assert "chain root" in result.seal.error


def _rechained_with(
    raw: RawDb, job_id: str, edit: Callable[[str, dict[str, object]], None]
) -> None:
    """Apply ``edit(type, payload)`` to every event, then re-chain the whole log."""
    events = []
    for _, event_id, event_type, payload_bytes, _ in raw.events(job_id):
        payload = parse(payload_bytes)
        edit(event_type, payload)
        events.append((event_id, event_type, canonical(payload)))
    raw.rewrite_log(job_id, events)


def _rechained_setting(
    raw: RawDb, job_id: str, event_type: str, node: str, /, **fields: object
) -> None:
    """Set ``fields`` in the payloads of ``node``'s ``event_type`` events, then re-chain."""

    def edit(kind: str, payload: dict[str, object]) -> None:
        if kind == event_type and payload.get("node_id") == node:
            payload.update(fields)

    _rechained_with(raw, job_id, edit)


def test_a_broken_commit_does_not_make_the_ledger_report_missing_events(
    refunded: Refunded, raw: RawDb
) -> None:
    """The refund's recorded result edited (not its result hash) and the log re-chained: the
    replay proof names the commit whose hash no longer matches; the ledger proof still reads
    what the log holds — every invocation started and finished once, each ledger row as its
    commit says — instead of reporting the steps after it as never started."""
    rt, job_id = refunded

    def edit(event_type: str, payload: dict[str, object]) -> None:
        if event_type == "tool_invocation_finished" and payload["node_id"] == "refund":
            payload["result"]["amount"] = 1  # type: ignore[index]

    _rechained_with(raw, job_id, edit)
    result = verify_job(rt.store, job_id)
    assert result.replay_proof_result.invariant == "commit_evidence"
    assert result.replay_proof_result.version == version_of(raw, job_id, "command_committed", 1)
    assert "does not match the recorded result" in result.replay_proof_result.error
    assert result.tool_invocation_ledger_proof.ok, result.tool_invocation_ledger_proof.errors
    assert result.tool_invocation_ledger_proof.pending_idempotency_keys == ()
    assert failing_checks(result) == {"replay_proof_result", "seal"}


def test_a_step_out_of_order_does_not_make_the_ledger_report_missing_events(
    refunded: Refunded, raw: RawDb
) -> None:
    """The refund recorded as failed (retryable) and the log re-chained: the e-mail step that
    follows ran before its dependency completed (the replay proof says so), yet it was started,
    finished and committed as the ledger says, and the ledger proof holds."""
    rt, job_id = refunded
    _rechained_setting(raw, job_id, "node_finished", "refund", result_type="retryable_failure")
    result = verify_job(rt.store, job_id)
    assert result.replay_proof_result.invariant == "dependencies_first"
    assert "'email'" in result.replay_proof_result.error
    assert result.tool_invocation_ledger_proof.ok, result.tool_invocation_ledger_proof.errors
    assert result.tool_invocation_ledger_proof.pending_idempotency_keys == ()


def test_a_deleted_plan_is_reported_once(refunded: Refunded, raw: RawDb) -> None:
    """plan_generated deleted and the log re-chained: the replay proof says the plan is missing;
    the ledger rows still agree with the log's starts (their step ids were reported as "not as
    in its tool_invocation_started event", compared with the missing plan's)."""
    rt, job_id = refunded
    events = [(e, t, p) for _, e, t, p, _ in raw.events(job_id) if t != "plan_generated"]
    raw.rewrite_log(job_id, events)
    result = verify_job(rt.store, job_id)
    assert result.replay_proof_result.invariant == "plan"
    assert result.tool_invocation_ledger_proof.ok, result.tool_invocation_ledger_proof.errors
    assert failing_checks(result) == {"replay_proof_result", "seal"}


def test_a_start_naming_another_node_differs_from_its_ledger_row_in_the_node_only(
    refunded: Refunded, raw: RawDb
) -> None:
    """The e-mail's tool_invocation_started made to name a node not in the plan (its step id
    left as it was) and the log re-chained: the ledger row differs from that start in its node,
    not in its step id — the start's own step id is compared, not the plan's for that node."""
    rt, job_id = refunded
    _rechained_setting(raw, job_id, "tool_invocation_started", "email", node_id="mail")
    result = verify_job(rt.store, job_id)
    assert result.replay_proof_result.invariant == "node_in_plan"
    [error] = result.tool_invocation_ledger_proof.errors
    assert error.endswith(": node_id not as in its tool_invocation_started event"), error


def test_a_duplicated_start_fails_the_ledger_proof_too(refunded: Refunded, raw: RawDb) -> None:
    """A tool_invocation_started repeated (under an event id of its own) and the log
    re-chained: one invocation started twice and finished once, which both proofs report."""
    rt, job_id = refunded
    events = []
    for _, event_id, event_type, payload, _ in raw.events(job_id):
        events.append((event_id, event_type, payload))
        if event_type == "tool_invocation_started" and parse(payload)["node_id"] == "email":
            events.append((new_event_id(), event_type, payload))
    raw.rewrite_log(job_id, events)
    result = verify_job(rt.store, job_id)
    assert result.replay_proof_result.invariant == "closing_rule"
    [error] = result.tool_invocation_ledger_proof.errors
    assert error.startswith("invocation ") and error.endswith("started twice"), error


def test_edit_a_ledger_rows_result(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    [(stored,)] = raw.rows(
        "SELECT result FROM tool_invocations WHERE job_id = ? AND node_id = 'refund'", (job_id,)
    )
    edited = json.loads(stored)
    edited["amount"] += 1
    raw.execute(
        "UPDATE tool_invocations SET result = ? WHERE job_id = ? AND node_id = 'refund'",
        (canonical(edited).decode(), job_id),
    )
    result = verify_job(rt.store, job_id)
    assert "tool_invocation_ledger_proof" in failing_checks(result)
    assert any("result does not match" in e for e in result.tool_invocation_ledger_proof.errors)
    assert result.replay_proof_result.invariant == "ledger"
    assert result.stored_chain.ok and result.seal.ok


def test_delete_the_seal(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    assert raw.execute("DELETE FROM seals WHERE job_id = ?", (job_id,)) == 1
    result = verify_job(rt.store, job_id)
    assert failing_checks(result) == {"seal"}
    assert result.seal.present is False
    assert result.seal.error == "the job is completed but has no seal"


def test_seal_signed_by_an_unknown_key(refunded: Refunded, raw: RawDb) -> None:
    """A forger re-signs a seal over a re-chained log with a key of their own."""
    rt, job_id = refunded
    before = verify_job(rt.store, job_id)
    forger = SigningKey.generate()
    seal = forger.seal(job_id, before.stored_chain.event_count, before.event_chain_root_hash)
    raw.execute(
        "UPDATE seals SET key_id = ?, signature = ?, sealed_at = ? WHERE job_id = ?",
        (seal.key_id, seal.signature, seal.sealed_at, job_id),
    )
    result = verify_job(rt.store, job_id)
    assert failing_checks(result) == {"seal"}
    assert result.seal.error == (
        f"the seal is signed by unknown key {forger.key_id} (not registered in this database)"
    )


def test_seal_fields_edited_without_the_key(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    raw.execute("UPDATE seals SET event_count = event_count - 1 WHERE job_id = ?", (job_id,))
    result = verify_job(rt.store, job_id)
    assert failing_checks(result) == {"seal"}
    assert "does not verify" in result.seal.error


def test_public_key_row_swapped(refunded: Refunded, raw: RawDb) -> None:
    """Replacing the recorded public key under the same key id does not make a forged
    signature valid: the key id is the hash of the key."""
    rt, job_id = refunded
    forger = SigningKey.generate()
    raw.execute("UPDATE signing_keys SET public_key = ?", (forger.public.public_key_b64,))
    result = verify_job(rt.store, job_id)
    assert failing_checks(result) == {"seal"}
    assert "does not match key id" in result.seal.error


@pytest.mark.parametrize("status", ["running", "failed"])
def test_status_row_disagrees_with_the_log(refunded: Refunded, raw: RawDb, status: str) -> None:
    rt, job_id = refunded
    raw.execute("UPDATE jobs SET status = ? WHERE job_id = ?", (status, job_id))
    result = verify_job(rt.store, job_id)
    assert "replay_proof_result" in failing_checks(result)
    assert result.replay_proof_result.invariant == "status"
    assert result.replay_proof_result.error == (
        f"status: the job is {status} but its log says completed"
    )


def test_seal_by_a_key_added_to_the_database_fails_a_pinned_pack(
    refunded: Refunded, raw: RawDb, tmp_path: Path
) -> None:
    """A forger re-chains the log, adds a public key of their own to the database and seals the
    forgery with it: every recorded key is accepted by default, so the job exports, and the
    pack is signed with the runtime's key. A pack verifier pinning that key must not accept a
    seal it does not pin — as `verify_job(trusted_keys=...)` does not."""
    rt, job_id = refunded
    events = []
    for _, event_id, event_type, payload_bytes, _ in raw.events(job_id):
        payload = parse(payload_bytes)
        if event_type == "node_finished":
            payload["duration_ms"] = 1  # (nothing derives it: only the seal tells)
        events.append((event_id, event_type, canonical(payload)))
    raw.rewrite_log(job_id, events)
    forged = verify_job(rt.store, job_id)
    forger = SigningKey.generate()
    hashes = [bytes.fromhex(row[4]) for row in raw.events(job_id)]
    seal = forger.seal(
        job_id, forged.stored_chain.event_count, forged.event_chain_root_hash, events_root(hashes)
    )
    raw.execute(
        "INSERT INTO signing_keys (key_id, algorithm, public_key, created_at) "
        "VALUES (?, 'ed25519', ?, ?)",
        (forger.key_id, forger.public.public_key_b64, seal.sealed_at),
    )
    raw.execute(
        "UPDATE seals SET key_id = ?, signature = ?, sealed_at = ?, event_chain_root_hash = ?, "
        "events_root = ? WHERE job_id = ?",
        (
            seal.key_id,
            seal.signature,
            seal.sealed_at,
            seal.event_chain_root_hash,
            seal.events_root,
            job_id,
        ),
    )
    runtime_key = SigningKey.load(default_key_path(rt.store.url))
    assert not verify_job(rt.store, job_id, trusted_keys=[runtime_key.public_raw]).ok
    pack = export_pack(rt.store, job_id, tmp_path / "pack").pack_dir
    assert verify_pack(pack).verdict == "MATCH"  # self-attested: the pack's own keys
    pinned = verify_pack(pack, trusted_keys=[runtime_key.public_raw])
    assert pinned.verdict == "INTEGRITY_FAIL"
    assert any(f"unknown key {forger.key_id}" in e for e in pinned.errors)
    both = verify_pack(pack, trusted_keys=[runtime_key.public_raw, forger.public_raw])
    assert both.verdict == "MATCH"


def test_job_rows_output_edited(refunded: Refunded, raw: RawDb) -> None:
    """The output `affidavit jobs show` and `GET /api/jobs/{id}` report is the job row's: it
    must be the output the sealed log recorded."""
    rt, job_id = refunded
    output = rt.get_job(job_id).output
    assert isinstance(output, dict)
    forged = {**output, "email": {"sent": False}}
    raw.execute("UPDATE jobs SET output = ? WHERE job_id = ?", (canonical(forged).decode(), job_id))
    result = verify_job(rt.store, job_id)
    assert failing_checks(result) == {"replay_proof_result"}
    assert result.replay_proof_result.error == "status: the job row's output is not its log's"
    raw.execute(  # the same output, but not as the store writes it (JCS), as for ledger results
        "UPDATE jobs SET output = ? WHERE job_id = ?", (json.dumps(output, indent=1), job_id)
    )
    assert not verify_job(rt.store, job_id).ok
    raw.execute("UPDATE jobs SET output = ? WHERE job_id = ?", (canonical(output).decode(), job_id))
    assert verify_job(rt.store, job_id).ok


@pytest.mark.parametrize("column", ["output", "error"])
def test_job_rows_output_or_error_where_the_log_has_none(
    refunded: Refunded, raw: RawDb, column: str
) -> None:
    """A completed job has no error; a job that is not finished has neither."""
    rt, job_id = refunded
    raw.execute(f"UPDATE jobs SET {column} = ? WHERE job_id = ?", ('{"type": "x"}', job_id))
    if column == "output":  # (a running job's log: the terminal event dropped)
        events = [(e, t, p) for _, e, t, p, _ in raw.events(job_id)][:-1]
        raw.rewrite_log(job_id, events)
        raw.execute("UPDATE jobs SET status = 'running' WHERE job_id = ?", (job_id,))
        raw.execute("DELETE FROM seals WHERE job_id = ?", (job_id,))
    result = verify_job(rt.store, job_id)
    assert failing_checks(result) == {"replay_proof_result"}
    assert result.replay_proof_result.error == f"status: the job row's {column} is not its log's"


def test_failed_job_rows_error_edited(make_runtime: Callable[..., Runtime], raw: RawDb) -> None:
    rt = make_runtime(tools(charge_tool("declined", fail=True)))
    job_id = rt.submit(plan({"id": "a", "type": "tool", "tool": "declined"})).job_id
    rt.run_until_idle()
    assert verify_job(rt.store, job_id).ok
    raw.execute(
        "UPDATE jobs SET error = ? WHERE job_id = ?",
        (canonical({"type": "timeout", "message": "the bank did not answer"}).decode(), job_id),
    )
    result = verify_job(rt.store, job_id)
    assert result.replay_proof_result.error == "status: the job row's error is not its log's"


@pytest.mark.parametrize("column", ["namespace", "plan_name", "submitted_by", "idempotency_key"])
def test_job_rows_submission_columns_edited(refunded: Refunded, raw: RawDb, column: str) -> None:
    """Who submitted the job, in which namespace (what the HTTP API lets a caller see), under
    which plan name and idempotency key: the job row says it as `job_created` recorded it."""
    rt, job_id = refunded
    raw.execute(f"UPDATE jobs SET {column} = 'someone-else' WHERE job_id = ?", (job_id,))
    result = verify_job(rt.store, job_id)
    assert failing_checks(result) == {"replay_proof_result"}
    assert result.replay_proof_result.error == f"status: the job row's {column} is not its log's"


def test_failed_ledger_row_given_a_result(make_runtime: Callable[..., Runtime], raw: RawDb) -> None:
    """Only a committed row holds a result: a failed try's row claiming one (as if the charge
    went through) disagrees with the log, which recorded no result for it."""
    rt = make_runtime(tools(charge_tool("declined", fail=True)))
    job_id = rt.submit(plan({"id": "a", "type": "tool", "tool": "declined"})).job_id
    rt.run_until_idle()
    assert (
        raw.execute(
            "UPDATE tool_invocations SET result = ? WHERE job_id = ? AND status = 'failed'",
            ('{"charged":5}', job_id),
        )
        == 1
    )
    result = verify_job(rt.store, job_id)
    assert failing_checks(result) == {"tool_invocation_ledger_proof", "replay_proof_result"}
    [error] = result.tool_invocation_ledger_proof.errors
    assert error.endswith("is failed but holds a result")
