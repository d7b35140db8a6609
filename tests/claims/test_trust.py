"""Trust math against hand-computed sequences, pattern propagation, the trust log and the
immutability of evidence — on both backends."""

from __future__ import annotations

import pytest

from affidavit.claims import ClaimService, TrustPolicy
from affidavit.claims.trust import ewma
from affidavit.core.errors import AgentExistsError, AgentNotFound, StoreError, ValidationError
from affidavit.store import Store
from tests.claims.conftest import make_service

ACCURATE = ({"return_code": 0}, "true")
INACCURATE = ({"return_code": 0}, "false")
ERROR = ({}, "sleep 5")  # with a short timeout


def verify(svc: ClaimService, outcome: tuple[dict[str, int], str], **claim: str) -> float:
    content, command = outcome
    # Only ERROR must time out; the others get ample time (a sandbox starting on a loaded
    # machine must not turn an accurate claim into a timeout, which moves no trust).
    timeout = 0.2 if outcome is ERROR else 30.0
    result = svc.verify_claim(
        "alice", "custom", {**content, **claim}, command, "vera", timeout_s=timeout
    )
    return result.new_trust_score


def test_hand_computed_sequence_alpha_0_1(svc: ClaimService) -> None:
    # 0.5 → 0.1·1 + 0.9·0.5 = 0.55 → 0.1 + 0.9·0.55 = 0.595 → 0.9·0.595 = 0.5355
    #     → 0.1 + 0.9·0.5355 = 0.58195
    expected = [0.55, 0.595, 0.5355, 0.58195]
    got = [verify(svc, o) for o in (ACCURATE, ACCURATE, INACCURATE, ACCURATE)]
    assert got == pytest.approx(expected, abs=1e-12)
    agent = svc.get_agent("alice")
    assert agent.trust_score == pytest.approx(0.58195, abs=1e-12)
    assert (agent.verifications, agent.accurate_verifications) == (4, 3)


def test_alpha_is_configurable_and_thresholds_apply(store: Store) -> None:
    svc = make_service(store, trust=TrustPolicy(alpha=0.5))
    svc.add_agent("alice", namespace="team")
    svc.add_agent("vera", namespace="team")
    # 0.5 → 0.75 → 0.875 → 0.4375
    assert [verify(svc, o) for o in (ACCURATE, ACCURATE, INACCURATE)] == [0.75, 0.875, 0.4375]
    stats = svc.get_verification_statistics("alice")
    assert stats["requires_verification"] is True  # 0.4375 < 0.7
    verify(svc, ACCURATE)  # 0.71875
    assert svc.get_verification_statistics("alice")["requires_verification"] is False


def test_errors_do_not_move_trust_and_do_not_count_towards_reliability(
    svc: ClaimService,
) -> None:
    for _ in range(4):
        verify(svc, ACCURATE)
    score = svc.get_agent("alice").trust_score
    assert verify(svc, ERROR) == score
    stats = svc.get_verification_statistics("alice")
    assert (stats["total_verifications"], stats["error_verifications"]) == (4, 1)
    assert stats["reliable"] is False
    verify(svc, INACCURATE)
    stats = svc.get_verification_statistics("alice")
    assert stats["reliable"] is True
    assert stats["accuracy_rate"] == pytest.approx(0.8)
    assert stats["by_claim_type"]["custom"] == {
        "total": 5,
        "accurate": 4,
        "inaccurate": 1,
        "errors": 1,
        "accuracy": 0.8,
    }
    assert [r["verdict"] for r in stats["recent_verifications"]] == [
        "inaccurate",
        "error",
        "accurate",
        "accurate",
        "accurate",
        "accurate",
    ]


def test_score_is_clamped() -> None:
    assert ewma(1.0, 1.0, 0.1) == 1.0
    assert ewma(0.0, 0.0, 0.1) == 0.0
    with pytest.raises(Exception, match="alpha"):
        TrustPolicy(alpha=0)


# --- patterns ---------------------------------------------------------------------------------


@pytest.fixture
def patterns(svc: ClaimService) -> ClaimService:
    svc.add_agent("owen", namespace="team")
    svc.add_agent("olga", namespace="elsewhere")
    svc.add_pattern("owen", access_level="public", pattern_id="pub")
    svc.add_pattern("owen", access_level="system", pattern_id="sys")
    svc.add_pattern("owen", access_level="private", pattern_id="priv")
    svc.add_pattern("alice", access_level="public", pattern_id="mine")
    svc.add_pattern("olga", access_level="public", pattern_id="far")
    return svc


def test_public_pattern_success_adds_the_documented_delta_once(patterns: ClaimService) -> None:
    result = patterns.verify_claim(
        "alice", "custom", {"return_code": 0, "pattern_id": "pub"}, "true", "vera"
    )
    assert result.new_trust_score == pytest.approx(0.57)  # 0.50 + 0.05 + 0.02
    assert result.propagation_result["propagated"] is True
    assert result.propagation_result["trust_delta"] == pytest.approx(0.02)
    assert result.propagation_result["new_trust_score"] == result.new_trust_score
    pattern = patterns.get_pattern("pub")
    assert pattern is not None and (pattern.success_count, pattern.failure_count) == (1, 0)


def test_system_pattern_failure_subtracts_the_delta(patterns: ClaimService) -> None:
    result = patterns.verify_claim(
        "alice", "custom", {"return_code": 0, "pattern_id": "sys"}, "false", "vera"
    )
    assert result.new_trust_score == pytest.approx(0.43)  # 0.50 − 0.05 − 0.02
    pattern = patterns.get_pattern("sys")
    assert pattern is not None and pattern.failure_count == 1


@pytest.mark.parametrize(
    ("pattern_id", "reason"),
    [
        ("priv", "access level 'private' is not public or system"),
        ("mine", "owned by the claimant"),
        ("far", "another namespace"),
        ("missing", "pattern not found"),
    ],
)
def test_ineligible_patterns_are_not_applied_and_say_why(
    patterns: ClaimService, pattern_id: str, reason: str
) -> None:
    result = patterns.verify_claim(
        "alice", "custom", {"return_code": 0, "pattern_id": pattern_id}, "true", "vera"
    )
    assert result.new_trust_score == pytest.approx(0.55)
    assert result.propagation_result["propagated"] is False
    assert reason in result.propagation_result["reason"]
    assert result.propagation_result["trust_delta"] == 0.0


def test_an_error_verdict_propagates_nothing(patterns: ClaimService) -> None:
    result = patterns.verify_claim(
        "alice", "custom", {"pattern_id": "pub"}, "sleep 5", "vera", timeout_s=0.2
    )
    assert result.verdict == "error"
    assert result.new_trust_score == 0.5
    assert "could not judge" in result.propagation_result["reason"]


def test_pattern_at_the_ceiling_is_clamped(store: Store) -> None:
    svc = make_service(store, trust=TrustPolicy(initial_score=1.0))
    for agent in ("alice", "vera", "owen"):
        svc.add_agent(agent, namespace="team")
    svc.add_pattern("owen", access_level="public", pattern_id="pub")
    result = svc.verify_claim("alice", "custom", {"pattern_id": "pub"}, "true", "vera")
    assert result.new_trust_score == 1.0
    assert result.propagation_result["trust_delta"] == 0.0


# --- agents, the trust log and the evidence ---------------------------------------------------


def test_agents_are_registered_once_and_validated(svc: ClaimService) -> None:
    with pytest.raises(AgentExistsError):
        svc.add_agent("alice", namespace="other")
    with pytest.raises(ValidationError, match="role"):
        svc.add_agent("bob", role="root")
    with pytest.raises(ValidationError, match="agent id"):
        svc.add_agent("bad id")
    with pytest.raises(AgentNotFound):
        svc.get_agent("nobody")
    assert [a.agent_id for a in svc.list_agents("team")] == ["alice", "vera"]
    assert svc.get_agent("alice").to_dict(threshold=0.7, reliable_after=5)["trust_score"] == 0.5


def test_trust_log_is_chained_and_matches_the_score(svc: ClaimService) -> None:
    results = [verify(svc, o) for o in (ACCURATE, INACCURATE, ERROR)]
    log = svc.get_trust_history("alice")
    assert [e.type for e in log] == ["agent_registered", *["claim_verified"] * 3]
    assert [e.version for e in log] == [1, 2, 3, 4]
    scores = [e.payload["score_after"] for e in log[1:]]
    assert scores == results
    befores = [e.payload["score_before"] for e in log[1:]]
    assert befores == [0.5, *scores[:-1]]
    assert [e.payload["observation"] for e in log[1:]] == [1.0, 0.0, None]
    check = svc.check_trust_log("alice")
    assert check["ok"] and check["entries"] == 4 and check["score_matches"]


def test_history_is_newest_first_and_filters_by_type(svc: ClaimService) -> None:
    first = svc.verify_claim("alice", "custom", {}, "true", "vera")
    second = svc.verify_claim("alice", "code_quality", {}, "false", "vera")
    history = svc.get_verification_history("alice")
    assert [h["verification_id"] for h in history] == [
        second.verification_id,
        first.verification_id,
    ]
    assert [h["verification_id"] for h in svc.get_verification_history("alice", limit=1)] == [
        second.verification_id
    ]
    only = svc.get_verification_history("alice", claim_type="custom")
    assert [h["verification_id"] for h in only] == [first.verification_id]
    record = only[0]
    assert record["evidence_id"] == first.evidence_id
    assert record["verifier_id"] == "vera" and record["claim"] == {}
    assert record["command"] == "true" and record["return_code"] == 0
    with pytest.raises(ValidationError):
        svc.get_verification_history("alice", claim_type="opinion")
    with pytest.raises(ValidationError):
        svc.get_verification_history("alice", limit=0)
    with pytest.raises(AgentNotFound):
        svc.get_verification_history("nobody")


def test_evidence_id_is_the_digest_of_the_stored_record(svc: ClaimService, store: Store) -> None:
    from affidavit.core.canonical import canonical, sha256_hex

    result = svc.verify_claim("alice", "custom", {"output_contains": "hi"}, "echo hi", "vera")
    evidence = svc.get_evidence(result.verification_id)
    assert evidence is not None
    evidence_id = evidence.pop("evidence_id")
    assert evidence_id == result.evidence_id == sha256_hex(canonical(evidence))
    log = svc.get_trust_history("alice")
    assert log[-1].payload["evidence_id"] == evidence_id


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE claim_verifications SET verdict = 'accurate'",
        "DELETE FROM claim_verifications",
        "UPDATE trust_log SET chain_hash = 'x'",
        "DELETE FROM trust_log",
    ],
)
def test_the_database_refuses_to_change_evidence(
    svc: ClaimService, store: Store, statement: str
) -> None:
    svc.verify_claim("alice", "custom", {}, "false", "vera")
    with pytest.raises(StoreError, match="append-only"), store.transaction() as tx:
        tx.execute(statement)
        tx.query("SELECT 1")
    assert svc.get_verification_history("alice")[0]["verdict"] == "inaccurate"
    assert svc.check_trust_log("alice")["ok"]


def test_a_tampered_trust_log_is_detected(svc: ClaimService, store: Store) -> None:
    verify(svc, ACCURATE)
    verify(svc, ACCURATE)
    # Only someone who drops the database's guard can edit the log; the chain still tells.
    with store.transaction() as tx:
        if store.backend == "sqlite":
            tx.execute("DROP TRIGGER trust_log_no_update")
        else:
            tx.execute("DROP TRIGGER trust_log_immutable ON trust_log")
        forged = b'{"forged":true}'
        tx.execute("UPDATE trust_log SET payload = ? WHERE version = 2", (forged,))
    check = svc.check_trust_log("alice")
    assert check["ok"] is False and check["first_bad_version"] == 2
