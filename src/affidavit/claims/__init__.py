"""Claims and trust: verify what an agent claims by running the check, keep the evidence, and
score each agent's trust on that evidence alone (docs/claims.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.claims.model import Agent, ClaimType, Pattern, Role, TrustEntry, VerificationResult
from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
    from affidavit.claims.sandbox import DEFAULT_ALLOWED_PROGRAMS, SandboxConfig
    from affidavit.claims.service import ClaimService
    from affidavit.claims.trust import TrustPolicy

# The service, its sandbox and the trust policy are imported on first use: the model (which
# the CLI's help texts name) does not pull them in.
_LAZY = {
    "DEFAULT_ALLOWED_PROGRAMS": "affidavit.claims.sandbox",
    "SandboxConfig": "affidavit.claims.sandbox",
    "ClaimService": "affidavit.claims.service",
    "TrustPolicy": "affidavit.claims.trust",
}


__getattr__ = lazy_exports("affidavit.claims", _LAZY, globals())


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
