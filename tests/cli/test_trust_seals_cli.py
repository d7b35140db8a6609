"""Trust logs are sealed like jobs: a trust log cut short in the database by hand (its rows
deleted, its score set back, its seals deleted too) is caught by `affidavit trust show` and
`affidavit verify --all`, and its seals are leaves of the transparency log — real CLI
subprocesses on both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from affidavit.claims import ClaimService
from affidavit.store import open_store
from tests.cli.test_cli import cli, json_of
from tests.cli.test_tampered_rows_cli import backend
from tests.verify.helpers import RawDb

LOCKED = ("trust_log", "claim_verifications", "trust_seals")


def three_verifications(url: str) -> list[float]:
    """alice (claimant) with three accurate verifications by vera: the scores after each."""
    store = open_store(url)
    try:
        svc = ClaimService(store)
        svc.add_agent("alice", namespace="team")
        svc.add_agent("vera", namespace="team")
        return [
            svc.verify_claim("alice", "custom", {"return_code": 0}, "true", "vera").new_trust_score
            for _ in range(3)
        ]
    finally:
        store.close()


def unlock(raw: RawDb) -> None:
    """Drop the triggers that keep the trust tables append-only, as a database owner can."""
    for table in LOCKED:
        if backend(raw.url) == "sqlite":
            raw.execute(f"DROP TRIGGER {table}_no_delete")
        else:
            raw.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")


def cut_last_entry(raw: RawDb, score: float, *, seals: bool) -> None:
    """Delete alice's last trust-log entry and its evidence row (and its seal, when
    ``seals``), and set her score back to the entry before it."""
    unlock(raw)
    [(last,)] = raw.rows("SELECT max(version) FROM trust_log WHERE agent_id = 'alice'")
    [(payload,)] = raw.rows(
        "SELECT payload FROM trust_log WHERE agent_id = 'alice' AND version = ?", (last,)
    )
    verification_id = json.loads(bytes(payload))["verification_id"]
    assert raw.execute("DELETE FROM trust_log WHERE agent_id = 'alice' AND version = ?", (last,))
    assert raw.execute(
        "DELETE FROM claim_verifications WHERE verification_id = ?", (verification_id,)
    )
    if seals:
        assert raw.execute(
            "DELETE FROM trust_seals WHERE agent_id = 'alice' AND entry_count = ?", (last,)
        )
    assert raw.execute("UPDATE agents SET trust_score = ? WHERE agent_id = 'alice'", (score,))


def assert_caught(url: str, problem: str) -> None:
    shown = cli("trust", "show", "alice", "--db", url, "--json")
    assert shown.returncode == 1, shown.stderr
    check = json_of(shown)["trust_log"]
    assert not check["ok"] and any(problem in p for p in check["problems"]), check["problems"]
    human = cli("trust", "show", "alice", "--db", url)
    assert human.returncode == 1 and "DOES NOT VERIFY" in human.stdout
    assert problem in " ".join(human.stdout.split()), human.stdout
    audit = cli("verify", "--all", "--db", url, "--json")
    assert audit.returncode == 1, audit.stderr
    failed = json_of(audit)["failed_agents"]
    assert list(failed) == ["alice"] and any(problem in p for p in failed["alice"])
    table = cli("verify", "--all", "--db", url)
    assert table.returncode == 1 and "alice" in table.stdout and "NOT verified" in table.stdout


def test_every_trust_log_verifies_and_is_sealed(store_url: str) -> None:
    three_verifications(store_url)
    shown = cli("trust", "show", "alice", "--db", store_url, "--json")
    assert shown.returncode == 0, shown.stderr
    check = json_of(shown)["trust_log"]
    assert check["ok"] and check["sealed"] and check["problems"] == []
    assert check["seal"]["record_id"] == "trust:alice:4" and check["seal"]["event_count"] == 4
    human = cli("trust", "show", "alice", "--db", store_url)
    assert human.returncode == 0 and "verifies" in human.stdout
    audit = cli("verify", "--all", "--db", store_url, "--json")
    assert audit.returncode == 0 and json_of(audit)["failed_agents"] == {}


@pytest.mark.parametrize("seals", [False, True], ids=["rows", "rows_and_seal"])
def test_a_trust_log_cut_by_hand_is_caught(store_url: str, seals: bool) -> None:
    scores = three_verifications(store_url)
    cut_last_entry(RawDb(store_url), scores[-2], seals=seals)
    # without its seal the log ends where a seal does; the leaf the log queued says otherwise
    problem = "entry 4 was removed" if not seals else "this one was cut after entry 3"
    assert_caught(store_url, problem)


def test_a_cut_caught_after_the_seals_reached_the_transparency_log(store_url: str) -> None:
    scores = three_verifications(store_url)
    integrated = cli("log", "integrate", "--db", store_url, "--json")
    assert integrated.returncode == 0, integrated.stderr
    assert json_of(integrated)["integrated"] == 5  # two registrations, three verifications
    cut_last_entry(RawDb(store_url), scores[-2], seals=True)
    assert_caught(store_url, "the transparency log holds the seal of a trust log of 4 entries")


def test_a_score_set_back_is_caught(store_url: str) -> None:
    three_verifications(store_url)
    assert RawDb(store_url).execute("UPDATE agents SET trust_score = 0.5 WHERE agent_id = 'alice'")
    assert_caught(store_url, "is not its trust log's last score")


def test_trust_seals_are_leaves_of_the_transparency_log(store_url: str, tmp_path: Path) -> None:
    three_verifications(store_url)
    assert cli("log", "integrate", "--db", store_url).returncode == 0
    key = cli("log", "key", "--db", store_url).stdout.strip()
    proof = cli("log", "proof", "trust:alice:4", "--db", store_url)
    assert proof.returncode == 0, proof.stderr
    (tmp_path / "alice.tlog-proof").write_text(proof.stdout)
    checked = cli("log", "verify", str(tmp_path / "alice.tlog-proof"), "--key", key, "--json")
    assert checked.returncode == 0, checked.stdout
    leaf = json_of(checked)["leaf"]
    assert (leaf["job_id"], leaf["event_count"]) == ("trust:alice:4", 4)
    shown = json_of(cli("trust", "show", "alice", "--db", store_url, "--json"))
    assert leaf["event_chain_root_hash"] == shown["trust_log"]["seal"]["event_chain_root_hash"]
    # one leaf per seal: every length of alice's log, and vera's registration
    for n in (1, 2, 3):
        assert cli("log", "proof", f"trust:alice:{n}", "--db", store_url).returncode == 0
    assert cli("log", "proof", "trust:vera:1", "--db", store_url).returncode == 0
    assert cli("log", "proof", "trust:alice:5", "--db", store_url).returncode == 2
