"""Rows edited outside the store with values of another type than the format's, or with values
no runtime writes: each yields a verdict in which the affected check fails, never an exception.

SQLite keeps whatever value a column is given (`UPDATE events SET payload = '<json>'` in the
sqlite3 shell stores text, not bytes); PostgreSQL's typed columns refuse those edits, so the
storage-type cases run where they can happen. The cases that any database allows run on both.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from affidavit import Runtime, verify_events, verify_job
from affidavit.core.canonical import canonical, canonical_sha256, parse
from affidavit.verify import VerificationResult
from tests.cli.test_cli import cli, json_of
from tests.verify.helpers import RawDb, tools, waiting_job

Refunded = tuple[Runtime, str]


def failing(result: VerificationResult) -> set[str]:
    json.dumps(result.to_dict())  # the report is printable whatever the rows held
    return {c.name for c in result.checks() if not c.ok}


def sqlite_only(raw: RawDb) -> None:
    if not raw.url.startswith("sqlite:///"):
        pytest.skip("PostgreSQL's typed columns refuse this edit")


def version_of(raw: RawDb, job_id: str, event_type: str, nth: int = 0) -> int:
    return [v for v, _, t, _, _ in raw.events(job_id) if t == event_type][nth]


# --- storage types (SQLite) ---------------------------------------------------------------------

EVENT_CASES = {
    "payload_as_text": (
        "UPDATE events SET payload = CAST(payload AS TEXT) WHERE job_id = ? AND version = ?",
        "the payload is stored as text, not bytes",
    ),
    "event_id_as_blob": (
        "UPDATE events SET event_id = CAST(event_id AS BLOB) WHERE job_id = ? AND version = ?",
        "the event id is stored as bytes, not text",
    ),
    "type_as_blob": (
        "UPDATE events SET type = CAST(type AS BLOB) WHERE job_id = ? AND version = ?",
        "the event type is stored as bytes, not text",
    ),
}


@pytest.mark.parametrize("case", sorted(EVENT_CASES))
def test_event_column_of_another_type(refunded: Refunded, raw: RawDb, case: str) -> None:
    sqlite_only(raw)
    rt, job_id = refunded
    sql, reason = EVENT_CASES[case]
    version = version_of(raw, job_id, "tool_invocation_finished", 1)
    assert raw.execute(sql, (job_id, version)) == 1
    result = verify_job(rt.store, job_id)
    assert {"stored_chain", "replay_proof_result"} <= failing(result)
    assert result.stored_chain.first_bad_version == version
    replay = result.replay_proof_result
    assert (replay.invariant, replay.version) == ("payload", version)
    assert reason in replay.error


def test_text_payload_written_from_the_sqlite_shell(refunded: Refunded, raw: RawDb) -> None:
    """The edit a person makes by hand: same JSON but a smaller refund, stored as text."""
    sqlite_only(raw)
    rt, job_id = refunded
    version = version_of(raw, job_id, "tool_invocation_finished", 1)
    text = raw.events(job_id)[version - 1][3].decode().replace('"amount":4200', '"amount":1')
    raw.execute(
        "UPDATE events SET payload = ? WHERE job_id = ? AND version = ?", (text, job_id, version)
    )
    assert raw.rows(
        "SELECT typeof(payload) FROM events WHERE job_id = ? AND version = ?", (job_id, version)
    ) == [("text",)]
    result = verify_job(rt.store, job_id)
    assert {"stored_chain", "replay_proof_result", "seal"} <= failing(result)
    assert result.replay_proof_result.error.startswith(f"payload at version {version}: ")


SEAL_CASES = {
    "event_count_not_a_number": (
        "UPDATE seals SET event_count = 'abc' WHERE job_id = ?",
        "the seal row is malformed: seal field 'event_count' must be an integer",
    ),
    "event_count_a_float": (
        "UPDATE seals SET event_count = event_count + 0.5 WHERE job_id = ?",
        "the seal row is malformed: seal field 'event_count' must be an integer",
    ),
    "signature_as_blob": (
        "UPDATE seals SET signature = CAST(signature AS BLOB) WHERE job_id = ?",
        "the seal row is malformed: seal field 'signature' must be a string",
    ),
    "key_id_as_blob": (
        "UPDATE seals SET key_id = CAST(key_id AS BLOB) WHERE job_id = ?",
        "the seal row is malformed: seal field 'key_id' must be a string",
    ),
    "root_as_blob": (
        "UPDATE seals SET event_chain_root_hash = CAST(event_chain_root_hash AS BLOB) "
        "WHERE job_id = ?",
        "the seal row is malformed: seal field 'event_chain_root_hash' must be a string",
    ),
    "public_key_as_blob": (
        "UPDATE signing_keys SET public_key = CAST(public_key AS BLOB) WHERE ? IS NOT NULL",
        "is not 32 bytes",
    ),
}


@pytest.mark.parametrize("case", sorted(SEAL_CASES))
def test_seal_column_of_another_type(refunded: Refunded, raw: RawDb, case: str) -> None:
    sqlite_only(raw)
    rt, job_id = refunded
    sql, reason = SEAL_CASES[case]
    assert raw.execute(sql, (job_id,)) >= 1
    result = verify_job(rt.store, job_id)
    assert failing(result) == {"seal"}
    assert reason in result.seal.error


LEDGER_CASES = {
    "result_as_blob": "UPDATE tool_invocations SET result = CAST(result AS BLOB) "
    "WHERE job_id = ? AND node_id = 'refund'",
    "key_as_blob": "UPDATE tool_invocations SET idempotency_key = CAST(idempotency_key AS BLOB) "
    "WHERE job_id = ? AND node_id = 'refund'",
    "tool_name_as_blob": "UPDATE tool_invocations SET tool_name = CAST(tool_name AS BLOB) "
    "WHERE job_id = ? AND node_id = 'refund'",
}


@pytest.mark.parametrize("case", sorted(LEDGER_CASES))
def test_ledger_column_of_another_type(refunded: Refunded, raw: RawDb, case: str) -> None:
    sqlite_only(raw)
    rt, job_id = refunded
    assert raw.execute(LEDGER_CASES[case], (job_id,)) == 1
    result = verify_job(rt.store, job_id)
    assert "tool_invocation_ledger_proof" in failing(result)
    assert result.replay_proof_result.invariant == "ledger"
    assert result.stored_chain.ok and result.seal.ok


def test_cli_reports_an_odd_row_as_a_failed_check(
    refunded: Refunded, raw: RawDb, tmp_path: Path
) -> None:
    """Exit 1 with the verdict (one job, and every job with --all), no traceback."""
    sqlite_only(raw)
    _, job_id = refunded
    version = version_of(raw, job_id, "node_started", 1)
    raw.execute(
        "UPDATE events SET payload = CAST(payload AS TEXT) WHERE job_id = ? AND version = ?",
        (job_id, version),
    )
    raw.execute("UPDATE seals SET key_id = CAST(key_id AS BLOB) WHERE job_id = ?", (job_id,))
    one = cli("verify", job_id, "--db", raw.url, "--json")
    assert one.returncode == 1, one.stderr
    assert "Traceback" not in one.stderr
    doc = json_of(one)
    assert doc["ok"] is False and doc["stored_chain"]["first_bad_version"] == version
    assert doc["seal"]["key_id"] is None
    human = cli("verify", job_id, "--db", raw.url)
    assert human.returncode == 1 and "Traceback" not in human.stderr
    every = cli("verify", "--all", "--db", raw.url, "--json")
    assert every.returncode == 1 and "Traceback" not in every.stderr
    assert json_of(every)["failed_jobs"] == [job_id]
    assert json_of(every)["failed_jobs"] == [job_id]


# --- values no runtime writes (both backends) ---------------------------------------------------


def test_payload_nested_too_deeply(refunded: Refunded, raw: RawDb) -> None:
    """A result nested 1000 levels is JSON a parser reads, but more than a canonical encoder
    walks: the commit that hashes it fails the payload invariant, verification goes on."""
    rt, job_id = refunded
    events = [(e, t, p) for _, e, t, p, _ in raw.events(job_id)]
    at = version_of(raw, job_id, "tool_invocation_finished", 1) - 1
    payload = parse(events[at][2])
    payload["result"] = "@"
    deep = b"[" * 1000 + b"1" + b"]" * 1000
    events[at] = (events[at][0], events[at][1], canonical(payload).replace(b'"@"', deep))
    raw.rewrite_log(job_id, events)
    result = verify_job(rt.store, job_id)
    assert result.replay_proof_result.invariant == "payload"
    assert "nested too deeply" in result.replay_proof_result.error
    assert result.stored_chain.ok and "seal" in failing(result)


@pytest.mark.parametrize("column", ["output", "error"])
def test_job_row_output_or_error_that_is_not_json(
    refunded: Refunded, raw: RawDb, column: str
) -> None:
    """The job row's output and error are JSON text only by the store's writing; an edited one
    gives a verdict, for the job and with --all, not a traceback."""
    rt, job_id = refunded
    raw.execute(f"UPDATE jobs SET {column} = ? WHERE job_id = ?", ("[" * 100_000, job_id))
    result = verify_job(rt.store, job_id)
    assert failing(result) == {"replay_proof_result"}
    assert result.replay_proof_result.invariant == "status"
    one = cli("verify", job_id, "--db", raw.url, "--json")
    assert one.returncode == 1 and "Traceback" not in one.stderr, one.stderr
    assert json_of(one)["job_id"] == job_id
    every = cli("verify", "--all", "--db", raw.url, "--json")
    assert every.returncode == 1 and "Traceback" not in every.stderr, every.stderr
    assert json_of(every)["failed_jobs"] == [job_id]


LEDGER_EDITS = {
    "invocation_id": "invocation_id = 'forged'",
    "tool_name": "tool_name = 'wire_money'",
    "args_hash": "args_hash = '0000000000000000'",
    "node_id, step_id": "node_id = 'email', step_id = 'ffffffffffffffff'",
}


@pytest.mark.parametrize("columns", sorted(LEDGER_EDITS))
def test_ledger_columns_agree_with_the_log(refunded: Refunded, raw: RawDb, columns: str) -> None:
    """Every column of a ledger row that the log records too — the invocation that committed,
    the node and its step id, the tool, the arguments' hash — is compared with the log."""
    rt, job_id = refunded
    [(key,)] = raw.rows(
        "SELECT idempotency_key FROM tool_invocations WHERE job_id = ? AND node_id = 'refund'",
        (job_id,),
    )
    raw.execute(
        f"UPDATE tool_invocations SET {LEDGER_EDITS[columns]} "
        "WHERE job_id = ? AND idempotency_key = ?",
        (job_id, key),
    )
    result = verify_job(rt.store, job_id)
    assert failing(result) == {"tool_invocation_ledger_proof", "replay_proof_result"}
    assert result.tool_invocation_ledger_proof.errors == (
        f"ledger row {key[:16]}…: {columns} not as in its tool_invocation_started event",
    )


def test_tries_has_no_counterpart_in_the_log(refunded: Refunded, raw: RawDb) -> None:
    rt, job_id = refunded
    raw.execute("UPDATE tool_invocations SET tries = 3 WHERE job_id = ?", (job_id,))
    assert verify_job(rt.store, job_id).ok


def test_completed_tool_node_invoking_its_tool_again(
    store_url: str, raw: RawDb, tmp_path: Path
) -> None:
    """A tool node that completed calls its tool a second time under a new key, committed,
    with the ledger row to match, before the job is sealed (it waits for an approval): the
    replay proof names the first event of the second call."""
    with Runtime(store_url, tools=tools(), signing_key=tmp_path / "k") as rt:
        job_id = waiting_job(rt)
        events = [(e, t, p) for _, e, t, p, _ in raw.events(job_id)]
        kinds = [t for _, t, _ in events]
        at = kinds.index("node_finished") + 1
        started, finished, commit = (
            parse(events[kinds.index(t)][2])
            for t in ("tool_invocation_started", "tool_invocation_finished", "command_committed")
        )
        key, invocation, result = "f" * 64, "second", {"charged": 1, "key": "again"}
        started.update(idempotency_key=key, invocation_id=invocation)
        finished.update(idempotency_key=key, invocation_id=invocation, result=result)
        commit.update(
            idempotency_key=key, command_id=invocation, result_hash=canonical_sha256(result)
        )
        events[at:at] = [
            ("x-1", "tool_invocation_started", canonical(started)),
            ("x-2", "tool_invocation_finished", canonical(finished)),
            ("x-3", "command_committed", canonical(commit)),
        ]
        raw.rewrite_log(job_id, events)
        raw.execute(
            "INSERT INTO tool_invocations (job_id, idempotency_key, node_id, step_id, tool_name, "
            "args_hash, status, invocation_id, attempt_id, tries, result, error, created_at, "
            "updated_at) SELECT job_id, ?, node_id, step_id, tool_name, args_hash, status, ?, "
            "attempt_id, tries, ?, error, created_at, updated_at FROM tool_invocations "
            "WHERE job_id = ?",
            (key, invocation, canonical(result).decode(), job_id),
        )
        outcome = verify_job(rt.store, job_id)
        assert not outcome.ok
        replay = outcome.replay_proof_result
        assert (replay.invariant, replay.version) == ("not_rerun", at + 1)


# --- exports -----------------------------------------------------------------------------------


def export(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    return [{"job_id": job_id, **e.to_dict()} for e in rt.store.list_events(job_id)]


@pytest.mark.parametrize("field", ["event_id", "type"])
def test_export_with_a_lone_surrogate(refunded: Refunded, field: str) -> None:
    """`json.loads` reads "\\ud800" into a string that is not Unicode text."""
    rt, job_id = refunded
    events = copy.deepcopy(export(rt, job_id))
    events[2][field] += "\ud800"
    result = verify_events(events)
    assert not result.ok and not result.stored_chain.ok
    replay = result.replay_proof_result
    assert (replay.invariant, replay.version) == ("payload", 3)
    assert "is not Unicode text" in replay.error
    orjson.dumps(result.to_dict())


def test_export_job_id_with_a_lone_surrogate(refunded: Refunded) -> None:
    from affidavit import VerificationError

    rt, job_id = refunded
    events = [{**e, "job_id": "\ud800"} for e in export(rt, job_id)]
    with pytest.raises(VerificationError, match="not Unicode text"):
        verify_events(events)


# --- text that is not UTF-8 (SQLite) ------------------------------------------------------------

NOT_UTF8_CASES = {
    # bytes 0xff inside a TEXT value: SQLite keeps them, and a strict read fails
    "event_type": (
        "UPDATE events SET type = CAST(X'6e6f64655fff' AS TEXT) WHERE job_id = ? AND version = ?",
        {"stored_chain", "replay_proof_result"},
    ),
    "seal_sealed_at": (
        "UPDATE seals SET sealed_at = CAST(X'ff' AS TEXT) WHERE job_id = ? AND ? > 0",
        {"seal"},
    ),
    "ledger_result": (
        "UPDATE tool_invocations SET result = CAST(X'7bff7d' AS TEXT) "
        "WHERE job_id = ? AND node_id = 'refund' AND ? > 0",
        {"tool_invocation_ledger_proof"},
    ),
    # a job row: `verify --all` still lists the job (it reads only the ids) and reports it
    "job_status": (
        "UPDATE jobs SET status = CAST(X'636f6d706c65746564ff' AS TEXT) WHERE job_id = ? AND ? > 0",
        {"replay_proof_result"},
    ),
    # text the result quotes (the seal's key id, a ledger key): escaped, so it still prints
    "seal_key_id": (
        "UPDATE seals SET key_id = CAST(X'ff' AS TEXT) WHERE job_id = ? AND ? > 0",
        {"seal"},
    ),
    "ledger_key": (
        "UPDATE tool_invocations SET idempotency_key = CAST(X'6bff' AS TEXT) "
        "WHERE job_id = ? AND node_id = 'refund' AND ? > 0",
        {"tool_invocation_ledger_proof", "replay_proof_result"},
    ),
}


@pytest.mark.parametrize("case", sorted(NOT_UTF8_CASES))
def test_text_that_is_not_utf8_fails_a_check(
    refunded: Refunded, raw: RawDb, case: str, tmp_path: Path
) -> None:
    """Not a store error (exit 3): the edited row fails its check (exit 1), in the API, the
    CLI and `verify --all` alike."""
    sqlite_only(raw)
    rt, job_id = refunded
    sql, checks = NOT_UTF8_CASES[case]
    version = version_of(raw, job_id, "tool_invocation_finished", 1)
    assert raw.execute(sql, (job_id, version)) == 1
    result = verify_job(rt.store, job_id)
    assert checks <= failing(result)
    if case == "event_type":
        assert result.stored_chain.first_bad_version == version
        assert result.replay_proof_result.version == version
    single = cli("verify", job_id, "--db", raw.url, "--json")
    assert single.returncode == 1, single.stdout + single.stderr
    assert json_of(single)["ok"] is False
    every = cli("verify", "--all", "--db", raw.url, "--json")
    assert every.returncode == 1 and "Traceback" not in every.stderr
