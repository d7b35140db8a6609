"""What verification reports: the four proofs, the stored-chain check and the seal check.

``VerificationResult.to_dict()`` is exactly the object of docs/formats.md §6; the Python objects
carry more detail (every ledger disagreement, the violated invariant and its version).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from affidavit.verify._checks import CHECKS
from affidavit.verify._parts import Check, LedgerProof, ReplayProof, SealCheck, StoredChainCheck

__all__ = [
    "Check",
    "LedgerProof",
    "ReplayProof",
    "SealCheck",
    "StoredChainCheck",
    "VerificationResult",
]


@dataclass(frozen=True, slots=True)
class VerificationResult:
    """The outcome of :func:`affidavit.verify_job` / :func:`affidavit.verify_events`."""

    job_id: str
    execution_hash: str
    event_chain_root_hash: str
    tool_invocation_ledger_proof: LedgerProof
    replay_proof_result: ReplayProof
    stored_chain: StoredChainCheck
    seal: SealCheck
    status: str | None = None  # the job's status as stored (or as the log says, offline)
    notes: tuple[str, ...] = field(default=())
    # records of a job that has no job row (see verify_orphans): no status, and never ok
    orphan: bool = False

    @property
    def ok(self) -> bool:
        """The conjunction of every proof of the registry (``affidavit.verify._checks``)."""
        return all(c.ok(getattr(self, c.name)) for c in CHECKS if c.proof)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the object of docs/formats.md §6: the job id, every check in registry order, and
        the verdict."""
        doc: dict[str, Any] = {"job_id": self.job_id}
        for c in CHECKS:
            doc[c.name] = c.to_json(getattr(self, c.name))
        doc["ok"] = self.ok
        return doc

    def checks(self) -> list[Check]:
        """The checks in report order, each with the reason it holds or fails."""
        parts = [(c, getattr(self, c.name)) for c in CHECKS]
        return [Check(c.name, c.ok(part), c.detail(part)) for c, part in parts]
