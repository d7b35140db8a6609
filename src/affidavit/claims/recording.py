"""Recording one verification: the evidence document, and the one transaction that stores it,
moves trust (once per claim: :mod:`affidavit.claims.once`), and appends the sealed trust-log
entry (:mod:`affidavit.claims.sealing`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from affidavit.claims import once, records
from affidavit.claims.compare import ClaimRules, Judgement
from affidavit.claims.model import Agent, ClaimType, ClaimVerdict
from affidavit.claims.sandbox import RunResult, SandboxConfig
from affidavit.claims.sealing import TrustSealer, append_sealed
from affidavit.claims.trust import TrustPolicy, TrustUpdate, update
from affidavit.core.canonical import canonical, sha256_hex
from affidavit.core.events import utc_now
from affidavit.core.ids import uuid7
from affidavit.store import Store, Transaction


@dataclass(frozen=True, slots=True)
class Recorder:
    """What recording needs of the service."""

    store: Store
    sandbox: SandboxConfig
    trust: TrustPolicy
    sealer: TrustSealer

    def evidence(
        self,
        claimant: Agent,
        verifier_id: str,
        kind: ClaimType,
        rules: ClaimRules,
        run: RunResult,
        verdict: Judgement,
        timeout_s: float | None,
        claim_id: str | None,
    ) -> dict[str, Any]:
        """The evidence document of one verification (its canonical bytes are stored)."""
        record: dict[str, Any] = {
            "verification_id": str(uuid7()),
            "agent_id": claimant.agent_id,
            "namespace": claimant.namespace,
            "claim_type": kind.value,
            "claim": dict(rules.content),
            "command": run.command.text,
            "argv": list(run.command.argv),
            "workdir": run.workdir,
            "timeout_s": self.sandbox.timeout_s if timeout_s is None else timeout_s,
            "limits": dict(run.limits),
            "return_code": run.return_code,
            "duration_ms": round(run.duration_ms, 3),
            "timed_out": run.timed_out,
            "spawn_error": run.spawn_error,
            "stdout": run.stdout.to_dict(self.sandbox.excerpt_bytes),
            "stderr": run.stderr.to_dict(self.sandbox.excerpt_bytes),
            "verdict": verdict.verdict,
            "accurate": verdict.accurate,
            "decided_by": verdict.decided_by,
            "actual": verdict.actual,
            "verifier_id": verifier_id,
            "verified_at": utc_now(),
        }
        if claim_id is not None:  # the claim its agent recorded
            record["claim_id"] = claim_id
        return record

    def record(self, record: dict[str, Any], rules: ClaimRules, verdict: Judgement) -> ClaimVerdict:
        """Store ``record`` (from :meth:`evidence`) and move trust, in one transaction under
        the claimant's row lock: the evidence row; the score and counters (not for an
        ``error`` verdict, nor for a re-verification of a claim that already moved trust); a
        linked pattern's delta at most once; the claim's outcome; the trust-log entry and its
        seal."""
        body = canonical(record)
        evidence_id = sha256_hex(body)
        verification_id, claim_id = record["verification_id"], record.get("claim_id")
        with self.store.transaction(durable=True) as tx:
            agent = records.get_agent(tx, record["agent_id"], for_update=True)
            assert agent is not None  # agents are never deleted
            counting = once.decide(tx, claim_id, verdict.verdict)
            change = self._change(tx, agent, rules, verdict, counting)
            records.insert_verification(
                tx,
                verification_id=verification_id,
                agent_id=agent.agent_id,
                claim_type=record["claim_type"],
                verdict=verdict.verdict,
                decided_by=verdict.decided_by,
                verifier_id=record["verifier_id"],
                verified_at=record["verified_at"],
                evidence_id=evidence_id,
                evidence=body,
            )
            judged = verdict.verdict != "error"
            if counting.counted or not judged:
                records.save_trust(
                    tx, agent, score=change.after, judged=judged, accurate=verdict.accurate
                )
            if change.pattern_applied and rules.pattern_id is not None:
                records.count_pattern_outcome(tx, rules.pattern_id, success=verdict.accurate)
            counting = once.remember(
                tx,
                counting,
                claim_id=claim_id,
                agent_id=agent.agent_id,
                verification_id=verification_id,
                verdict=verdict.verdict,
            )
            append_sealed(
                tx,
                self.sealer,
                agent.agent_id,
                "claim_verified",
                self._entry(record, evidence_id, verdict, change, counting),
            )
        return ClaimVerdict(
            claim=dict(rules.content),
            actual=verdict.actual,
            verdict=verdict.verdict,
            decided_by=verdict.decided_by,
            evidence_id=evidence_id,
            verification_id=verification_id,
            new_trust_score=change.after,
            propagation_result=change.propagation,
            counted=counting.counted,
            disagrees=counting.disagrees,
        )

    def _change(
        self,
        tx: Transaction,
        agent: Agent,
        rules: ClaimRules,
        verdict: Judgement,
        counting: once.Counting,
    ) -> TrustUpdate:
        """How the verdict moves the claimant's trust: not at all for a re-verification."""
        if counting.first is not None:
            return once.unmoved(agent.trust_score, rules.pattern_id, counting.first)
        pattern = (
            records.get_pattern(tx, rules.pattern_id) if rules.pattern_id is not None else None
        )
        return update(
            self.trust,
            agent.trust_score,
            verdict.verdict,
            pattern_id=rules.pattern_id,
            pattern=pattern,
            claimant_id=agent.agent_id,
            namespace=agent.namespace,
        )

    def _entry(
        self,
        record: dict[str, Any],
        evidence_id: str,
        verdict: Judgement,
        change: TrustUpdate,
        counting: once.Counting,
    ) -> dict[str, Any]:
        """The payload of the verification's ``claim_verified`` trust-log entry."""
        return {
            "at": utc_now(),
            "verification_id": record["verification_id"],
            "evidence_id": evidence_id,
            "claim_id": record.get("claim_id"),
            "claim_type": record["claim_type"],
            "verdict": verdict.verdict,
            "decided_by": verdict.decided_by,
            "verifier_id": record["verifier_id"],
            "observation": change.observation,
            "alpha": self.trust.alpha,
            "score_before": change.before,
            "score_ewma": change.ewma,
            "pattern": change.propagation,
            "score_after": change.after,
            **counting.to_dict(),
        }
