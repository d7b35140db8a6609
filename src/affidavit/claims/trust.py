"""Trust math: an exponentially weighted average of verdicts, plus linked-pattern propagation.

For a judged verdict (observation 1 for accurate, 0 for inaccurate)::

    ewma  = clamp(α · observation + (1 − α) · old)
    after = clamp(ewma ± pattern_delta)   # only when an eligible pattern is linked

A verdict of ``error`` (timeout, program that cannot start) is no evidence either way: the
score does not move and no pattern propagates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from affidavit.claims.model import PROPAGATING_ACCESS, Pattern
from affidavit.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TrustPolicy:
    alpha: float = 0.1
    initial_score: float = 0.5
    pattern_delta: float = 0.02
    requires_verification_below: float = 0.7
    reliable_after: int = 5

    def __post_init__(self) -> None:
        if not (0 < self.alpha <= 1):
            raise ConfigError(f"trust alpha must be in (0, 1], not {self.alpha}")
        for name in ("initial_score", "pattern_delta", "requires_verification_below"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= 1):
                raise ConfigError(f"trust {name} must be in [0, 1], not {value}")
        if self.reliable_after < 0:
            raise ConfigError("reliable_after must be ≥ 0")


def clamp(score: float) -> float:
    return min(1.0, max(0.0, score))


def ewma(old: float, observation: float, alpha: float) -> float:
    """``clamp(α · observation + (1 − α) · old)``."""
    return clamp(alpha * observation + (1 - alpha) * old)


def pattern_refusal(pattern: Pattern | None, claimant_id: str, namespace: str) -> str | None:
    """Why a linked pattern does not propagate to the claimant's trust, or ``None`` if it
    does: it must exist, be public or system, be in the claimant's namespace, and not be
    owned by the claimant (an agent cannot boost itself with its own pattern)."""
    if pattern is None:
        return "pattern not found"
    if pattern.access_level not in PROPAGATING_ACCESS:
        return f"pattern access level {pattern.access_level!r} is not public or system"
    if pattern.namespace != namespace:
        return "pattern belongs to another namespace"
    if pattern.owner_agent_id == claimant_id:
        return "pattern is owned by the claimant"
    return None


@dataclass(frozen=True, slots=True)
class TrustUpdate:
    before: float
    observation: float | None  # None: an error verdict, no evidence
    ewma: float
    after: float
    propagation: dict[str, Any]
    pattern_applied: bool


def update(
    policy: TrustPolicy,
    before: float,
    verdict: str,
    *,
    pattern_id: str | None,
    pattern: Pattern | None,
    claimant_id: str,
    namespace: str,
) -> TrustUpdate:
    """The new score after one verdict, with the propagation result of the seed's shape:
    ``{"propagated", "pattern_id", "trust_delta", "new_trust_score", "reason"}``."""
    observation = {"accurate": 1.0, "inaccurate": 0.0}.get(verdict)
    moved = before if observation is None else ewma(before, observation, policy.alpha)
    propagation: dict[str, Any] = {
        "propagated": False,
        "pattern_id": pattern_id,
        "trust_delta": 0.0,
        "new_trust_score": None,
        "reason": "no pattern linked",
    }
    if pattern_id is None:
        return TrustUpdate(before, observation, moved, moved, propagation, False)
    if observation is None:
        propagation["reason"] = "the verification could not judge the claim: nothing to propagate"
        return TrustUpdate(before, observation, moved, moved, propagation, False)
    refusal = pattern_refusal(pattern, claimant_id, namespace)
    if refusal is not None:
        propagation["reason"] = refusal
        return TrustUpdate(before, observation, moved, moved, propagation, False)
    sign = 1.0 if observation == 1.0 else -1.0
    after = clamp(moved + sign * policy.pattern_delta)
    propagation.update(
        propagated=True,
        trust_delta=after - moved,
        new_trust_score=after,
        reason="pattern success propagated" if sign > 0 else "pattern failure propagated",
    )
    return TrustUpdate(before, observation, moved, after, propagation, True)
