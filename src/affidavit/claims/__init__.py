"""Claims and trust: verify what an agent claims by running the check, keep the evidence, and
score each agent's trust on that evidence alone (docs/claims.md)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from affidavit.claims.model import Agent, ClaimType, ClaimVerdict, Pattern, Role, TrustEntry
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


_lazy = lazy_exports("affidavit.claims", _LAZY, globals())

# Names kept for one release after a rename (old name -> new name): each use warns.
DEPRECATED = {"VerificationResult": "ClaimVerdict"}


def deprecated_name(package: str, name: str) -> Any:
    """The object an old name of ``package`` stands for (see :data:`DEPRECATED`), with a
    ``DeprecationWarning`` naming the new one."""
    new = DEPRECATED[name]
    warnings.warn(
        f"{package}.{name} is deprecated and will be removed in the next release: use "
        f"{package}.{new} (a claim's verdict; affidavit.verify.VerificationResult is a job's)",
        DeprecationWarning,
        stacklevel=3,
    )
    return globals()[new]


def __getattr__(name: str) -> Any:
    if name in DEPRECATED:
        return deprecated_name("affidavit.claims", name)
    return _lazy(name)


__all__ = [
    "DEFAULT_ALLOWED_PROGRAMS",
    "Agent",
    "ClaimService",
    "ClaimType",
    "ClaimVerdict",
    "Pattern",
    "Role",
    "SandboxConfig",
    "TrustEntry",
    "TrustPolicy",
]
