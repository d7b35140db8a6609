"""The values of the claims layer: claim types, roles, agents, patterns, results."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from affidavit.core.canonical import parse
from affidavit.core.errors import InvalidClaim, TamperedRecordError, ValidationError


class ClaimType(StrEnum):
    TEST_RESULT = "test_result"
    PERFORMANCE_METRIC = "performance_metric"
    CODE_QUALITY = "code_quality"
    SECURITY_FINDING = "security_finding"
    DEPLOYMENT_STATUS = "deployment_status"
    CUSTOM = "custom"


class Role(StrEnum):
    OBSERVER = "observer"  # may be the subject of claims; may not verify
    AGENT = "agent"  # may verify claims of agents in its namespace
    ADMIN = "admin"  # may verify claims of agents in any namespace


VERIFIER_ROLES = frozenset({Role.AGENT, Role.ADMIN})
ACCESS_LEVELS = ("private", "team", "shared", "public", "system")
PROPAGATING_ACCESS = frozenset({"public", "system"})

_IDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}\Z")


def is_ident(value: Any) -> bool:
    return isinstance(value, str) and _IDENT.match(value) is not None


def check_ident(value: Any, what: str) -> str:
    """An agent id, namespace or pattern id: 1–128 of ``[A-Za-z0-9_.:@-]``, starting with a
    letter or digit."""
    if not is_ident(value):
        raise ValidationError(
            f"{what} {value!r} is invalid",
            hint="Use 1–128 letters, digits and _ . : @ - (starting with a letter or digit).",
        )
    return str(value)


def claim_type(value: Any) -> ClaimType:
    """Raises :class:`InvalidClaim` for an unknown type."""
    try:
        return ClaimType(value)
    except ValueError:
        raise InvalidClaim(
            f"unknown claim type {value!r}",
            hint=f"Claim types: {', '.join(t.value for t in ClaimType)}.",
        ) from None


def role(value: Any) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise ValidationError(
            f"unknown role {value!r}", hint="Roles: observer, agent, admin."
        ) from None


@dataclass(frozen=True, slots=True)
class Agent:
    """An agent and its trust: ``verifications`` counts the verdicts that moved trust
    (accurate or inaccurate); ``error_verifications`` those that could not be judged."""

    agent_id: str
    namespace: str
    role: str
    trust_score: float
    verifications: int
    accurate_verifications: int
    error_verifications: int
    created_at: str
    updated_at: str

    def requires_verification(self, threshold: float) -> bool:
        return self.trust_score < threshold

    def reliable(self, after: int) -> bool:
        return self.verifications >= after

    def to_dict(self, *, threshold: float, reliable_after: int) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "namespace": self.namespace,
            "role": self.role,
            "trust_score": self.trust_score,
            "requires_verification": self.requires_verification(threshold),
            "reliable": self.reliable(reliable_after),
            "verifications": self.verifications,
            "accurate_verifications": self.accurate_verifications,
            "error_verifications": self.error_verifications,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class Pattern:
    """A learning pattern that a claim may link by ``pattern_id``."""

    pattern_id: str
    owner_agent_id: str
    namespace: str
    access_level: str
    name: str
    success_count: int
    failure_count: int
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "pattern_id": self.pattern_id,
            "owner_agent_id": self.owner_agent_id,
            "namespace": self.namespace,
            "access_level": self.access_level,
            "name": self.name,
            "success_count": self.success_count,
            "failure_count": self.failure_count,
            "created_at": self.created_at,
        }


@dataclass(frozen=True, slots=True)
class ClaimVerdict:
    """What :meth:`ClaimService.verify_claim` returns."""

    claim: dict[str, Any]
    actual: dict[str, Any]
    verdict: str  # accurate | inaccurate | error
    decided_by: str
    evidence_id: str  # hex SHA-256 of the stored evidence document
    verification_id: str
    new_trust_score: float
    propagation_result: dict[str, Any]
    counted: bool = True  # moved trust (false: an error, or a re-verification of the claim)
    disagrees: bool = False  # a re-verification judged otherwise than the one that counted

    @property
    def accurate(self) -> bool:
        return self.verdict == "accurate"

    def to_dict(self) -> dict[str, Any]:
        """The ``claims verify --json`` document (docs/formats.md §9)."""
        return {
            "accurate": self.accurate,
            "verdict": self.verdict,
            "decided_by": self.decided_by,
            "claim": self.claim,
            "actual": self.actual,
            "verification_id": self.verification_id,
            "evidence_id": self.evidence_id,
            "new_trust_score": self.new_trust_score,
            "propagation": self.propagation_result,
            "counted": self.counted,
            "disagrees": self.disagrees,
        }


def trust_entry_name(agent_id: str, version: object) -> str:
    """How an error names an entry of a trust log."""
    return f"agent {agent_id}, trust log entry {version}"


@dataclass(frozen=True, slots=True)
class TrustEntry:
    """One entry of an agent's hash-chained trust log."""

    agent_id: str
    version: int
    entry_id: str
    type: str
    payload_bytes: bytes
    chain_hash: str

    @property
    def payload(self) -> Any:
        """The payload, decoded.

        Raises:
            TamperedRecordError: the stored payload is not JSON (edited outside affidavit).
        """
        try:
            return parse(self.payload_bytes)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deeply
            raise TamperedRecordError(
                trust_entry_name(self.agent_id, self.version), "the stored payload is not JSON"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "entry_id": self.entry_id,
            "type": self.type,
            "payload": self.payload,
            "chain_hash": self.chain_hash,
        }
