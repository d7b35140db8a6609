"""A claim moves its author's trust once (affidavit.claims.once): re-verifying a recorded claim
is evidence, never a second vote; one judged otherwise is flagged. Both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.claims import ClaimService
from affidavit.store import Store
from tests.claims.conftest import make_service


@pytest.fixture
def team(store: Store, project: Path) -> ClaimService:
    (project / "check.py").write_text("raise SystemExit(0)\n")
    svc = make_service(store, project=project)
    for agent in ("alice", "vera", "vic"):
        svc.add_agent(agent, namespace="team")
    svc.add_pattern("vic", access_level="public", pattern_id="pub")
    return svc


def test_re_verifying_a_claim_ten_times_leaves_the_score_where_the_first_left_it(
    team: ClaimService,
) -> None:
    made = team.make_claim("alice", "custom", {"return_code": 0, "pattern_id": "pub"}, "true")
    first = team.verify_made_claim(made.claim_id, "vera")
    assert first.counted and first.new_trust_score == pytest.approx(0.57)
    for verifier in ["vera", "vic"] * 5:
        again = team.verify_made_claim(made.claim_id, verifier)
        assert again.accurate and not again.counted and not again.disagrees
        assert again.new_trust_score == first.new_trust_score
        assert again.propagation_result["propagated"] is False
        assert first.verification_id in again.propagation_result["reason"]
    agent = team.get_agent("alice")
    assert agent.trust_score == first.new_trust_score
    assert (agent.verifications, agent.accurate_verifications) == (1, 1)
    assert team.get_pattern("pub").success_count == 1  # type: ignore[union-attr]
    assert len(team.get_verification_history("alice")) == 11  # every one is evidence
    view = team.claim_view(made.claim_id)
    assert [v["counted"] for v in view["verifications"]] == [True] + [False] * 10
    assert view["disagreements"] == 0
    check = team.check_trust_log("alice")
    assert check["ok"], check["problems"]


def test_a_disagreeing_re_verification_is_flagged_and_moves_nothing(
    team: ClaimService, project: Path
) -> None:
    made = team.make_claim("alice", "custom", {"return_code": 0}, "python check.py")
    first = team.verify_made_claim(made.claim_id, "vera")
    assert first.accurate and first.counted
    (project / "check.py").write_text("raise SystemExit(1)\n")  # the project changed
    second = team.verify_made_claim(made.claim_id, "vic")
    assert second.verdict == "inaccurate" and second.disagrees and not second.counted
    assert second.new_trust_score == first.new_trust_score
    assert team.get_agent("alice").trust_score == first.new_trust_score
    view = team.claim_view(made.claim_id)
    assert view["disagreements"] == 1
    assert [(v["verdict"], v["counted"], v["disagrees"]) for v in view["verifications"]] == [
        ("accurate", True, False),
        ("inaccurate", False, True),
    ]
    check = team.check_trust_log("alice")
    assert check["ok"], check["problems"]
    [flag] = check["disagreements"]
    assert flag["claim_id"] == made.claim_id
    assert flag["verification_id"] == second.verification_id
    assert (flag["verdict"], flag["counted_verdict"]) == ("inaccurate", "accurate")
    assert flag["counted_verification_id"] == first.verification_id


def test_a_verification_that_could_not_judge_leaves_the_claim_to_the_next(
    team: ClaimService,
) -> None:
    made = team.make_claim("alice", "custom", {}, "sleep 1")
    timed_out = team.verify_made_claim(made.claim_id, "vera", timeout_s=0.1)
    assert timed_out.verdict == "error" and not timed_out.counted and not timed_out.disagrees
    assert team.get_agent("alice").error_verifications == 1
    judged = team.verify_made_claim(made.claim_id, "vic", timeout_s=30)
    assert judged.accurate and judged.counted and judged.new_trust_score == 0.55
    again = team.verify_made_claim(made.claim_id, "vera", timeout_s=0.1)
    assert again.verdict == "error" and not again.disagrees
    assert team.claim_view(made.claim_id)["disagreements"] == 0
    assert team.check_trust_log("alice")["ok"]


def test_claims_given_whole_by_an_operator_each_count(team: ClaimService) -> None:
    for _ in range(2):
        assert team.verify_claim("alice", "custom", {}, "true", "vera").counted
    assert team.get_agent("alice").trust_score == pytest.approx(0.595)


def test_concurrent_verifications_of_one_claim_count_once(team: ClaimService) -> None:
    from concurrent.futures import ThreadPoolExecutor

    made = team.make_claim("alice", "custom", {}, "true")
    with ThreadPoolExecutor(6) as pool:
        verdicts = list(
            pool.map(lambda v: team.verify_made_claim(made.claim_id, v), ["vera", "vic"] * 3)
        )
    assert sorted(v.counted for v in verdicts) == [False] * 5 + [True]
    agent = team.get_agent("alice")
    assert (agent.trust_score, agent.verifications) == (0.55, 1)
    assert team.check_trust_log("alice")["ok"]


def test_a_signing_key_that_cannot_be_used_refuses_the_claim_before_it_runs(
    team: ClaimService, project: Path, tmp_path: Path
) -> None:
    from affidavit.claims.sealing import TrustSealer
    from affidavit.core.signing import SigningKeyError

    marker = tmp_path / "ran"
    (project / "mark.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    loose = tmp_path / "loose.key"
    loose.write_text("not a key")
    loose.chmod(0o644)  # readable by others: refused, as ssh refuses it
    unsandboxed = make_service(team.store, project=project, isolation="none")
    keyless = ClaimService(team.store, sandbox=unsandboxed.sandbox, sealer=TrustSealer(loose))
    with pytest.raises(SigningKeyError):
        keyless.verify_claim("alice", "custom", {}, "python mark.py", "vera")
    assert not marker.exists()
    assert team.get_verification_history("alice") == []
    assert team.check_trust_log("alice")["ok"]


def test_a_key_the_database_does_not_accept_seals_no_trust_entry(
    team: ClaimService, project: Path, tmp_path: Path
) -> None:
    """The trust log's seals take the same admission as job seals: a key other than the ones
    the database registered (the first that sealed in it) writes nothing."""
    from affidavit.claims.sealing import TrustSealer
    from affidavit.core.signing import SealKeyRefused

    before = team.get_agent("alice").trust_score
    unsandboxed = make_service(team.store, project=project, isolation="none")
    other = ClaimService(
        team.store, sandbox=unsandboxed.sandbox, sealer=TrustSealer(tmp_path / "other.key")
    )
    with pytest.raises(SealKeyRefused):
        other.verify_claim("alice", "custom", {"return_code": 0}, "true", "vera")
    assert team.get_verification_history("alice") == []
    assert team.get_agent("alice").trust_score == before
    assert team.check_trust_log("alice")["ok"]
