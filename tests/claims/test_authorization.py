"""Who may verify whose claims, and the order of the checks — each refusal runs nothing and
records nothing (both backends)."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.claims import ClaimService
from affidavit.core.errors import (
    AgentNotFound,
    AuthorizationError,
    ClaimRejected,
    CommandNotAllowed,
    NamespaceForbidden,
    SelfVerificationError,
    ValidationError,
    VerifierRoleForbidden,
)
from affidavit.store import Store
from tests.claims.conftest import make_service, nothing_recorded


@pytest.fixture
def team(store: Store, project: Path) -> ClaimService:
    (project / "touch.py").write_text("print('ran')\n")
    svc = make_service(store, project=project)
    svc.add_agent("alice", namespace="team", role="agent")
    svc.add_agent("vera", namespace="team", role="agent")
    svc.add_agent("otto", namespace="team", role="observer")
    svc.add_agent("xena", namespace="other", role="agent")
    svc.add_agent("root", namespace="ops", role="admin")
    return svc


def refused(
    svc: ClaimService, project: Path, error: type[Exception], verifier: str, **kw: object
) -> Exception:
    args: dict[str, object] = {
        "agent_id": "alice",
        "claim_type": "custom",
        "claim_content": {},
        "command": "python touch.py",
        "verifier_id": verifier,
        **kw,
    }
    with pytest.raises(error) as info:
        svc.verify_claim(**args)  # type: ignore[arg-type]
    assert nothing_recorded(svc)
    return info.value


def test_observer_may_not_verify(team: ClaimService, project: Path) -> None:
    exc = refused(team, project, VerifierRoleForbidden, "otto")
    assert isinstance(exc, AuthorizationError) and exc.code == "verifier_role_forbidden"


def test_verifier_from_another_namespace_may_not_verify(team: ClaimService, project: Path) -> None:
    exc = refused(team, project, NamespaceForbidden, "xena")
    assert isinstance(exc, AuthorizationError) and exc.code == "verifier_namespace_forbidden"


def test_admin_may_verify_across_namespaces(team: ClaimService, project: Path) -> None:
    result = team.verify_claim(
        "alice", "custom", {"output_contains": "ran"}, "python touch.py", "root"
    )
    assert result.accurate
    assert team.get_verification_history("alice")[0]["verifier_id"] == "root"


def test_self_verification_is_refused(team: ClaimService, project: Path) -> None:
    exc = refused(team, project, SelfVerificationError, "alice")
    assert isinstance(exc, ClaimRejected) and exc.code == "self_verification"


def test_unknown_agents(team: ClaimService, project: Path) -> None:
    refused(team, project, AgentNotFound, "nobody")
    refused(team, project, AgentNotFound, "no\x00body")  # no agent can have this id
    with pytest.raises(AgentNotFound, match="agent 'ghost' not found"):
        team.verify_claim("ghost", "custom", {}, "python touch.py", "vera")


# The checks run in the documented order: the first one that fails is reported.


def test_self_verification_is_checked_before_existence(team: ClaimService, project: Path) -> None:
    with pytest.raises(SelfVerificationError):
        team.verify_claim("ghost", "custom", {}, "true", "ghost")


def test_existence_before_role(team: ClaimService, project: Path) -> None:
    with pytest.raises(AgentNotFound):
        team.verify_claim("ghost", "custom", {}, "true", "otto")


def test_role_before_namespace_and_claim(team: ClaimService, project: Path) -> None:
    (team.add_agent("olaf", namespace="other", role="observer"),)
    refused(team, project, VerifierRoleForbidden, "olaf", claim_type="opinion")


def test_namespace_before_claim_validation(team: ClaimService, project: Path) -> None:
    refused(team, project, NamespaceForbidden, "xena", claim_type="opinion", command="rm -rf /")


def test_claim_before_command(team: ClaimService, project: Path) -> None:
    exc = refused(team, project, ValidationError, "vera", claim_type="opinion", command="rm x")
    assert not isinstance(exc, CommandNotAllowed)
    refused(team, project, CommandNotAllowed, "vera", command="rm x")
