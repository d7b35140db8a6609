"""The store's trust operations (migration 15) on both backends: claim outcomes, trust-log
seals with their transparency-log leaves, their append-only guard, and the migration filling
outcomes from the evidence already recorded."""

from __future__ import annotations

import pytest

from affidavit.claims import ClaimService
from affidavit.core.seal import log_leaf
from affidavit.core.signing import SigningKey
from affidavit.store import Store, open_store, trust_record_id
from affidavit.store.migrations import VERSION_TABLE
from tests.verify.helpers import RawDb


def test_outcomes_and_seals_round_trip(store: Store) -> None:
    svc = ClaimService(store)
    svc.add_agent("a:b", namespace="team")  # (seals entry 1 itself)
    claim = svc.make_claim("a:b", "custom", {}, "true")  # (the outcome's foreign key)
    key = SigningKey.generate()
    seal = key.seal(trust_record_id("a:b", 7), 7, "ab" * 32)
    with store.transaction() as tx:
        assert tx.claim_outcome(claim.claim_id) is None
        tx.claim_outcome_insert(claim.claim_id, "a:b", "v-1", "accurate")
        tx.key_register(key.public, created_at=seal.sealed_at)
        tx.trust_seal_insert("a:b", seal, leaf=log_leaf(seal), queued_at=1.0)
    with store.transaction() as tx:
        outcome = tx.claim_outcome(claim.claim_id)
        assert outcome is not None and (outcome.verification_id, outcome.verdict) == (
            "v-1",
            "accurate",
        )
        assert tx.trust_seal_latest("a:b") == seal
        assert tx.trust_seal_latest("a") is None
        assert tx.tlog_record_leaf("trust:a:b:7") == (None, True)
        assert tx.tlog_record_leaf("trust:a:b:8") == (None, False)
    assert seal.job_id == "trust:a:b:7"


def test_outcomes_and_seals_are_append_only(store: Store, store_url: str) -> None:
    svc = ClaimService(store)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    claim = svc.make_claim("alice", "custom", {}, "true")
    svc.verify_made_claim(claim.claim_id, "vera")
    raw = RawDb(store_url)
    for sql in (
        "DELETE FROM trust_seals",
        "UPDATE trust_seals SET entry_count = 9",
        "DELETE FROM claim_outcomes",
        "UPDATE claim_outcomes SET verdict = 'inaccurate'",
    ):
        with pytest.raises(Exception, match="append-only"):
            raw.execute(sql)
    assert raw.rows("SELECT count(*) FROM trust_seals") == [(3,)]


def test_the_migration_fills_outcomes_from_recorded_evidence(store_url: str) -> None:
    store = open_store(store_url)
    svc = ClaimService(store)
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    claim = svc.make_claim("alice", "custom", {}, "sleep 1")
    svc.verify_made_claim(claim.claim_id, "vera", timeout_s=0.1)  # an error: no outcome
    first = svc.verify_made_claim(claim.claim_id, "vera")
    svc.verify_made_claim(claim.claim_id, "vera")
    store.close()
    raw = RawDb(store_url)  # as if migration 15 had not run yet
    cascade = "" if store_url.startswith("sqlite") else " CASCADE"
    raw.execute(f"DROP TABLE claim_outcomes{cascade}")
    raw.execute(f"DROP TABLE trust_seals{cascade}")
    raw.execute(f"DELETE FROM {VERSION_TABLE} WHERE version = 15")
    store = open_store(store_url)
    try:
        with store.transaction() as tx:
            outcome = tx.claim_outcome(claim.claim_id)
        assert outcome is not None and outcome.verification_id == first.verification_id
    finally:
        store.close()


def test_a_copy_made_before_migration_15_reads_as_unsealed(store_url: str) -> None:
    """A store opened read-only (which never migrates) reads a copy without the trust tables:
    no outcome, no trust seal — so its trust logs do not verify, and say why."""
    store = open_store(store_url)
    ClaimService(store).add_agent("alice", namespace="team")
    store.close()
    raw = RawDb(store_url)
    for statement in (
        "DROP TABLE claim_outcomes",
        "DROP TABLE trust_seals",
        f"DELETE FROM {VERSION_TABLE} WHERE version = 15",
    ):
        raw.execute(statement)
    store = open_store(store_url, read_only=True)
    try:
        check = ClaimService(store).check_trust_log("alice")
        assert not check["ok"] and not check["sealed"]
        assert check["problems"] == [
            "the trust log has no seal: nothing signed says how long it is"
        ]
    finally:
        store.close()
