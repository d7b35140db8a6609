"""Claims recorded by their own agent and verified by another, by id, on both backends."""

from __future__ import annotations

import pytest

from affidavit.claims import ClaimService
from affidavit.claims.made import ClaimNotFound
from affidavit.core.errors import (
    AgentNotFound,
    CommandNotAllowed,
    InvalidClaim,
    NamespaceForbidden,
    SelfVerificationError,
    StoreError,
    VerifierRoleForbidden,
)
from affidavit.store import Store
from tests.claims.conftest import nothing_recorded


@pytest.fixture
def team(svc: ClaimService) -> ClaimService:
    svc.add_agent("otto", namespace="team", role="observer")
    svc.add_agent("xena", namespace="other", role="agent")
    return svc


def test_made_then_verified_by_another_agent(team: ClaimService) -> None:
    made = team.make_claim("alice", "custom", {"output_contains": "ok"}, "echo ok")
    assert (made.agent_id, made.namespace, made.command) == ("alice", "team", "echo ok")
    assert team.get_claim(made.claim_id) == made
    assert nothing_recorded(team)  # recording a claim runs nothing and moves nothing
    result = team.verify_made_claim(made.claim_id, "vera")
    assert result.accurate and result.claim == {"output_contains": "ok"}
    evidence = team.get_evidence(result.verification_id)
    assert evidence is not None and evidence["claim_id"] == made.claim_id
    assert team.check_trust_log("alice")["ok"]


@pytest.mark.parametrize(
    ("verifier", "error"),
    [
        ("alice", SelfVerificationError),
        ("otto", VerifierRoleForbidden),
        ("xena", NamespaceForbidden),
        ("nobody", AgentNotFound),
    ],
)
def test_verifying_a_made_claim_keeps_the_rules(
    team: ClaimService, verifier: str, error: type[Exception]
) -> None:
    made = team.make_claim("alice", "custom", {}, "true")
    with pytest.raises(error):
        team.verify_made_claim(made.claim_id, verifier)
    assert nothing_recorded(team)


def test_a_bad_claim_is_not_recorded(team: ClaimService) -> None:
    with pytest.raises(CommandNotAllowed, match="-m timeit"):
        team.make_claim("alice", "custom", {}, "python -m timeit pass")
    with pytest.raises(InvalidClaim):
        team.make_claim("alice", "custom", {"return_code": "zero"}, "true")
    with pytest.raises(AgentNotFound):
        team.make_claim("nobody", "custom", {}, "true")
    with pytest.raises(ClaimNotFound):
        team.verify_made_claim("no-such-claim", "vera")


def test_recorded_claims_cannot_be_changed(team: ClaimService, store: Store) -> None:
    made = team.make_claim("alice", "custom", {"return_code": 1}, "false")
    with pytest.raises(StoreError), store.transaction() as tx:
        tx.execute("UPDATE claims SET command = 'true' WHERE claim_id = ?", (made.claim_id,))
    assert team.get_claim(made.claim_id).command == "false"
