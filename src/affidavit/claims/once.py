"""A claim moves its author's trust once.

The first verification that judges a recorded claim (``accurate`` or ``inaccurate``) moves the
claimant's score and is remembered as the claim's outcome (``claim_outcomes``). Every later
verification of the same claim is recorded as evidence, and logged, but moves nothing: not the
score, not the counters, not a linked pattern. One whose verdict differs from the outcome is
flagged (``disagrees``): the same command judged the same claim two ways, which says the check
is not reproducible (a flaky test, a changed project) — worth an operator's look, never a
second vote. An ``error`` verdict (timeout, spawn error) judges nothing: it is no outcome and no
disagreement. A claim given whole by an operator (no ``claim_id``) is its own single
verification and always counts.

Decided inside the transaction that records the verification, under the claimant's row lock,
so concurrent verifications of one claim agree on which one counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from affidavit.claims.trust import TrustUpdate
from affidavit.store import ClaimOutcome, Transaction


@dataclass(frozen=True, slots=True)
class Counting:
    """Whether one verification moves trust, and what it is compared with."""

    counted: bool
    first: ClaimOutcome | None  # the verification that moved trust for this claim before
    disagrees: bool  # judged otherwise than ``first``

    def to_dict(self) -> dict[str, Any]:
        """The trust log entry's fields: ``counted``, ``counted_verification_id`` and
        ``counted_verdict`` (of the verification that moved trust, this one's when it did),
        ``disagrees``."""
        return {
            "counted": self.counted,
            "counted_verification_id": self.first.verification_id if self.first else None,
            "counted_verdict": self.first.verdict if self.first else None,
            "disagrees": self.disagrees,
        }


def decide(tx: Transaction, claim_id: str | None, verdict: str) -> Counting:
    """Whether a verification of ``claim_id`` with ``verdict`` moves trust (module contract).
    The caller holds the claimant's row lock."""
    judged = verdict != "error"
    if claim_id is None:
        return Counting(judged, None, False)
    first = tx.claim_outcome(claim_id)
    if first is None:
        return Counting(judged, None, False)
    return Counting(False, first, judged and verdict != first.verdict)


def remember(
    tx: Transaction,
    counting: Counting,
    *,
    claim_id: str | None,
    agent_id: str,
    verification_id: str,
    verdict: str,
) -> Counting:
    """Record the outcome of a claim whose first judging verification this is; the
    :class:`Counting` as the trust log states it (naming this verification when it counted)."""
    if not counting.counted or claim_id is None:
        return counting
    tx.claim_outcome_insert(claim_id, agent_id, verification_id, verdict)
    return Counting(True, ClaimOutcome(claim_id, verification_id, verdict), False)


def unmoved(before: float, pattern_id: str | None, first: ClaimOutcome) -> TrustUpdate:
    """The trust update of a re-verification: nothing moves."""
    reason = (
        f"the claim moved trust once, at verification {first.verification_id} "
        f"({first.verdict}); a re-verification moves nothing"
    )
    propagation: dict[str, Any] = {
        "propagated": False,
        "pattern_id": pattern_id,
        "trust_delta": 0.0,
        "new_trust_score": None,
        "reason": reason,
    }
    return TrustUpdate(before, None, before, before, propagation, False)
