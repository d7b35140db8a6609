"""Fixtures for the claims tests: a service on each backend with a claimant and a verifier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit.claims import ClaimService, SandboxConfig, TrustPolicy
from affidavit.store import Store


def make_service(
    store: Store,
    *,
    project: Path | None = None,
    trust: TrustPolicy | None = None,
    **sandbox: object,
) -> ClaimService:
    config = SandboxConfig(project_dir=str(project) if project else None, **sandbox)  # type: ignore[arg-type]
    return ClaimService(store, sandbox=config, trust=trust)


@pytest.fixture
def svc(store: Store) -> ClaimService:
    """A service with claimant ``alice`` and verifier ``vera`` (both in namespace ``team``)."""
    service = ClaimService(store)
    service.add_agent("alice", namespace="team", role="agent")
    service.add_agent("vera", namespace="team", role="agent")
    return service


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """An empty project directory for commands to run in."""
    path = tmp_path / "project"
    path.mkdir()
    yield path


def nothing_recorded(service: ClaimService, agent_id: str = "alice") -> bool:
    """No verification was recorded and the trust log holds only the registration."""
    return (
        service.get_verification_history(agent_id) == []
        and len(service.get_trust_history(agent_id)) == 1
        and service.get_agent(agent_id).trust_score == 0.5
    )
