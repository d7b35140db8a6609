"""Rows edited in the database by hand (as someone with write access to it would) are refused by
every command that reads them, as `verify` reports them: a message naming the record, the
documented exit code, no traceback — on both backends.

SQLite keeps whatever value a column is given (`UPDATE events SET payload = '<json>'` in the
sqlite3 shell stores text, not bytes); PostgreSQL's typed columns refuse those edits, so the
storage-type cases run where they can happen. A payload that is not JSON any database allows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.claims import ClaimService
from affidavit.store import open_store
from tests.cli.test_cli import cli, json_of
from tests.cli.test_verify_cli import finished_job
from tests.verify.helpers import RawDb

# (SQL on the event at version ?, backends it can happen on, what the error says)
EVENT_EDITS = {
    "payload_as_text": (
        "UPDATE events SET payload = CAST(payload AS TEXT) WHERE job_id = ? AND version = ?",
        ("sqlite",),
        "the payload is stored as text, not bytes",
    ),
    "payload_edited_as_text": (
        "UPDATE events SET payload = replace(CAST(payload AS TEXT), '4200', '1') "
        "WHERE job_id = ? AND version = ?",
        ("sqlite",),
        "the payload is stored as text, not bytes",
    ),
    "type_as_blob": (
        "UPDATE events SET type = CAST(type AS BLOB) WHERE job_id = ? AND version = ?",
        ("sqlite",),
        "the type is stored as bytes, not text",
    ),
    "payload_not_json": (
        "UPDATE events SET payload = ? WHERE job_id = ? AND version = ?",
        ("sqlite", "postgresql"),
        "the stored payload is not JSON",
    ),
}


def backend(url: str) -> str:
    return "sqlite" if url.startswith("sqlite:///") else "postgresql"


def edit_event(url: str, job_id: str, case: str) -> int:
    """Apply ``case`` to the refund's finished invocation; return the version edited."""
    sql, backends, _ = EVENT_EDITS[case]
    if backend(url) not in backends:
        pytest.skip("PostgreSQL's typed columns refuse this edit")
    raw = RawDb(url)
    version = [v for v, _, t, _, _ in raw.events(job_id) if t == "tool_invocation_finished"][1]
    params = (job_id, version) if case != "payload_not_json" else (b"{'x':", job_id, version)
    assert raw.execute(sql, params) == 1
    return version


@pytest.mark.parametrize("case", sorted(EVENT_EDITS))
def test_every_reader_of_a_log_refuses_an_edited_event_row(
    store_url: str, tmp_path: Path, case: str
) -> None:
    job_id = finished_job(store_url, tmp_path)
    version = edit_event(store_url, job_id, case)
    problem = EVENT_EDITS[case][2]
    message = f"job {job_id}, event {version}: {problem}"
    db = ("--db", store_url)

    verified = cli("verify", job_id, *db, "--json")
    assert verified.returncode == 1 and json_of(verified)["ok"] is False

    readers = [
        ("jobs", "trace", job_id),
        ("pack", "export", job_id, str(tmp_path / "pack")),
        ("jobs", "events", job_id),
        ("jobs", "events", job_id, "--after-version", str(version - 1)),
    ]
    for args in readers:
        human = cli(*args, *db)
        if args[1] == "events" and case == "payload_not_json":
            # the table prints the stored bytes as they are (only --json must decode them)
            assert human.returncode == 0 and "{'x':" in human.stdout
        else:
            assert human.returncode == 3, (args, human.stderr)
            assert "Traceback" not in human.stderr
            assert message in human.stderr, (args, human.stderr)
            assert f"affidavit verify {job_id}" in human.stderr
        as_json = cli(*args, *db, "--json")
        assert as_json.returncode == 3, (args, as_json.stderr)
        error = json_of(as_json)["error"]
        assert (error["code"], error["message"]) == ("replay_error", message)
    assert not (tmp_path / "pack").exists()
    # the events before the edited one are still read
    before = cli("jobs", "events", job_id, *db, "--json", "--limit", str(version - 1))
    assert before.returncode == 0 and len(json_of(before)) == version - 1


# --- the claims tables --------------------------------------------------------------------------


def unlock_claims_tables(raw: RawDb) -> None:
    """Drop the triggers that keep the evidence tables append-only, as a database owner can."""
    if backend(raw.url) == "sqlite":
        for name in ("trust_log_no_update", "claim_verifications_no_update"):
            raw.execute(f"DROP TRIGGER {name}")
    else:
        for table in ("trust_log", "claim_verifications"):
            raw.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")


def judged_agent(url: str) -> str:
    """Agents alice (claimant) and vera (verifier), one accurate claim judged; the claim's
    verification id."""
    store = open_store(url)
    try:
        svc = ClaimService(store)
        svc.add_agent("alice", namespace="team", role="agent")
        svc.add_agent("vera", namespace="team", role="agent")
        result = svc.verify_claim("alice", "custom", {"return_code": 0}, "true", "vera")
        assert result.accurate
        return result.verification_id
    finally:
        store.close()


TRUST_EDITS = {
    "payload_as_text": (
        "UPDATE trust_log SET payload = CAST(payload AS TEXT) WHERE agent_id = ? AND version = 2",
        ("sqlite",),
        "agent alice, trust log entry 2: the payload is stored as text, not bytes",
    ),
    "payload_not_json": (
        "UPDATE trust_log SET payload = ? WHERE agent_id = ? AND version = 2",
        ("sqlite", "postgresql"),
        "agent alice, trust log entry 2: the stored payload is not JSON",
    ),
}


@pytest.mark.parametrize("case", sorted(TRUST_EDITS))
def test_trust_commands_refuse_an_edited_trust_log_row(store_url: str, case: str) -> None:
    judged_agent(store_url)
    sql, backends, message = TRUST_EDITS[case]
    if backend(store_url) not in backends:
        pytest.skip("PostgreSQL's typed columns refuse this edit")
    raw = RawDb(store_url)
    unlock_claims_tables(raw)
    params = ("alice",) if case == "payload_as_text" else (b"[1,", "alice")
    assert raw.execute(sql, params) == 1
    for args in (("trust", "show", "alice"), ("trust", "history", "alice")):
        human = cli(*args, "--db", store_url)
        assert human.returncode == 1, (args, human.stderr)
        assert "Traceback" not in human.stderr and message in human.stderr
        as_json = cli(*args, "--db", store_url, "--json")
        assert as_json.returncode == 1
        assert json_of(as_json)["error"]["code"] == "record_tampered"
        assert json_of(as_json)["error"]["message"] == message


EVIDENCE_EDITS = {
    "evidence_as_text": (
        "UPDATE claim_verifications SET evidence = CAST(evidence AS TEXT) "
        "WHERE verification_id = ?",
        ("sqlite",),
        "the evidence is of another type",
    ),
    "evidence_not_json": (
        "UPDATE claim_verifications SET evidence = ? WHERE verification_id = ?",
        ("sqlite", "postgresql"),
        "the stored evidence is not a JSON object",
    ),
}


@pytest.mark.parametrize("case", sorted(EVIDENCE_EDITS))
def test_claims_history_refuses_an_edited_evidence_row(store_url: str, case: str) -> None:
    verification_id = judged_agent(store_url)
    sql, backends, problem = EVIDENCE_EDITS[case]
    if backend(store_url) not in backends:
        pytest.skip("PostgreSQL's typed columns refuse this edit")
    raw = RawDb(store_url)
    unlock_claims_tables(raw)
    [(evidence_id,)] = raw.rows(
        "SELECT evidence_id FROM claim_verifications WHERE verification_id = ?",
        (verification_id,),
    )
    params = (verification_id,) if case == "evidence_as_text" else (b"[]", verification_id)
    assert raw.execute(sql, params) == 1
    human = cli("claims", "history", "alice", "--db", store_url)
    assert human.returncode == 1, human.stderr
    assert "Traceback" not in human.stderr
    assert f"agent alice, evidence {evidence_id}: {problem}" in human.stderr
    as_json = cli("claims", "history", "alice", "--db", store_url, "--json")
    assert as_json.returncode == 1
    assert json_of(as_json)["error"]["code"] == "record_tampered"
