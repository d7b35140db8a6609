"""What verification reports: the four proofs, the stored-chain check and the seal check.

``VerificationResult.to_dict()`` is exactly the object of docs/formats.md §6; the Python objects
carry more detail (every ledger disagreement, the violated invariant and its version).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class LedgerProof:
    """At most once: every started invocation is closed exactly once, nothing is finished
    without having started, no key is committed twice, and the ledger rows agree with the log.
    ``pending_idempotency_keys`` are keys with an open invocation (legitimate while a job is
    running, waiting or parked; a failure once it is terminal)."""

    ok: bool
    pending_idempotency_keys: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    # keys closed with the outcome `unknown`: the tool may or may not have acted (a forced
    # cancel, a job failed with the call in flight); never verified as done nor as not done
    unknown_outcome_keys: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "ok": self.ok,
            "pending_idempotency_keys": list(self.pending_idempotency_keys),
        }
        if self.unknown_outcome_keys:
            doc["unknown_outcome_keys"] = list(self.unknown_outcome_keys)
        return doc


@dataclass(frozen=True, slots=True)
class ReplayProof:
    """The log replays into a consistent state. ``error`` names the first violated invariant
    (``invariant``) and the event version where it was violated (``version``)."""

    ok: bool
    error: str = ""
    invariant: str | None = None
    version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error}


@dataclass(frozen=True, slots=True)
class StoredChainCheck:
    """Every stored chain hash recomputes from the stored bytes, versions run 1..n."""

    ok: bool
    first_bad_version: int | None
    event_count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "first_bad_version": self.first_bad_version,
            "event_count": self.event_count,
        }


@dataclass(frozen=True, slots=True)
class SealCheck:
    """The seal is present (required once the job is terminal), signed by a known key, covers
    exactly this log (its length and chain root), and — once logged — is the job's one leaf in
    the transparency log (``codes`` names a failure there)."""

    present: bool
    ok: bool
    key_id: str | None = None
    event_count: int | None = None
    error: str = ""
    # failures against the transparency log, by name: ``seal_superseded``, ``log_duplicate``
    # (see affidavit.verify._logged)
    codes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "present": self.present,
            "ok": self.ok,
            "key_id": self.key_id,
            "event_count": self.event_count,
            "error": self.error,
            "codes": list(self.codes),
        }


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the human report."""

    name: str
    ok: bool
    detail: str


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
        """The conjunction of every check."""
        return (
            self.tool_invocation_ledger_proof.ok
            and self.replay_proof_result.ok
            and self.stored_chain.ok
            and self.seal.ok
        )

    def to_dict(self) -> dict[str, Any]:
        """Exactly the object of docs/formats.md §6."""
        return {
            "job_id": self.job_id,
            "execution_hash": self.execution_hash,
            "event_chain_root_hash": self.event_chain_root_hash,
            "tool_invocation_ledger_proof": self.tool_invocation_ledger_proof.to_dict(),
            "replay_proof_result": self.replay_proof_result.to_dict(),
            "stored_chain": self.stored_chain.to_dict(),
            "seal": self.seal.to_dict(),
            "ok": self.ok,
        }

    def checks(self) -> list[Check]:
        """The checks in report order, each with the reason it holds or fails."""
        ledger = self.tool_invocation_ledger_proof
        pending = ledger.pending_idempotency_keys
        if not ledger.ok:
            ledger_detail = "; ".join(ledger.errors) or "failed"
        elif pending:
            ledger_detail = f"{len(pending)} invocation(s) in flight: " + ", ".join(
                k[:16] + "…" for k in pending
            )
        else:
            ledger_detail = "every started invocation closed once; ledger agrees with the log"
        if ledger.ok and ledger.unknown_outcome_keys:
            ledger_detail += (
                f"; {len(ledger.unknown_outcome_keys)} invocation(s) of unknown outcome (the "
                "tool may or may not have acted): "
                + ", ".join(k[:16] + "…" for k in ledger.unknown_outcome_keys)
            )
        chain = self.stored_chain
        seal = self.seal
        if seal.ok and seal.present:
            seal_detail = f"signed by {seal.key_id} over {seal.event_count} events"
        elif seal.ok:
            seal_detail = "not sealed yet (the job is not terminal)"
        else:
            seal_detail = seal.error
        return [
            Check("execution_hash", True, self.execution_hash),
            Check("event_chain_root_hash", True, self.event_chain_root_hash),
            Check("tool_invocation_ledger_proof", ledger.ok, ledger_detail),
            Check(
                "replay_proof_result",
                self.replay_proof_result.ok,
                self.replay_proof_result.error or "the log replays consistently",
            ),
            Check(
                "stored_chain",
                chain.ok,
                f"{chain.event_count} events, every stored hash recomputes"
                if chain.ok
                else f"first bad version: {chain.first_bad_version}",
            ),
            Check("seal", seal.ok, seal_detail),
        ]
