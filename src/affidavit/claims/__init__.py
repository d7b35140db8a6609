"""Claims and trust: verify what an agent claims by running the check, keep the evidence, and
score each agent's trust on that evidence alone (docs/claims.md)."""

from __future__ import annotations

from affidavit.claims.model import Agent, ClaimType, Pattern, Role, TrustEntry, VerificationResult
from affidavit.claims.sandbox import DEFAULT_ALLOWED_PROGRAMS, SandboxConfig
from affidavit.claims.service import ClaimService
from affidavit.claims.trust import TrustPolicy

__all__ = [
    "DEFAULT_ALLOWED_PROGRAMS",
    "Agent",
    "ClaimService",
    "ClaimType",
    "Pattern",
    "Role",
    "SandboxConfig",
    "TrustEntry",
    "TrustPolicy",
    "VerificationResult",
]
