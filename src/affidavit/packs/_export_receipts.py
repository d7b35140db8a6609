"""The receipts of an exported pack (``receipt_pack.jsonl``): the RCE episode's open, step
and close receipts, then affidavit's event-log, seal and ledger receipts, hash-chained by
``parent_hashes``."""

from __future__ import annotations

from typing import Any

from affidavit.core.canonical import canonical
from affidavit.core.errors import AffidavitError
from affidavit.core.seal import PublicKey, Seal
from affidavit.packs import _format as F
from affidavit.store import LedgerRow


class Receipts:
    """The receipts of the run ``job_id``, in order, each naming its predecessor's hash."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.items: list[dict[str, Any]] = []

    def add(self, rtype: str, ts: str, body: dict[str, Any]) -> None:
        seq = len(self.items)
        self.items.append(
            {
                "receipt_id": f"r_{F.sha256_hex(f'{self.job_id}:{seq}'.encode())[:24]}",
                "type": rtype,
                "timestamp": ts,
                "schema_version": "3.0",
                "seq": seq,
                "proof_tier": "core",
                "parent_hashes": [F.receipt_hash(self.items[-1])] if self.items else [],
                "run_id": self.job_id,
                **body,
            }
        )

    def lines(self) -> list[bytes]:
        """Each receipt's stored line: the JCS of its body."""
        return [canonical(F.receipt_body(r)) for r in self.items]


def add_episode(
    receipts: Receipts,
    contract: dict[str, Any],
    payloads: list[dict[str, Any]],
    timestamps: dict[str, str],
    times: tuple[str, str],
) -> None:
    """The open receipt, one step receipt per step payload, the close receipt."""
    created_at, ended_at = times
    episode_id = contract["episode_id"]
    spec_hash = F.h(F.episode_spec_view(contract))
    receipts.add(
        F.OPEN,
        created_at,
        {
            "episode_id": episode_id,
            "episode_spec_hash": spec_hash,
            "objective": contract["objective"],
            "inputs_hash": F.h(contract["inputs"]),
            "script_hash": F.h(contract["replay_script"]),
            "env_fingerprint_hash": contract["environment"]["env_fingerprint_hash"],
            "replay_basis": "recorded_trace",
            "comparator_tier": "A",
            "n_steps": len(contract["replay_script"]["steps"]),
        },
    )
    for payload in payloads:
        receipts.add(F.STEP, timestamps[payload["step_id"]], payload)
    n_passed = sum(1 for p in payloads if p["step_status"] == "PASS")
    receipts.add(
        F.CLOSE,
        ended_at,
        {
            "episode_id": episode_id,
            "episode_spec_hash": spec_hash,
            "outputs_hash": F.outputs_hash(payloads),
            "n_steps_executed": sum(1 for p in payloads if p["step_status"] != "SKIPPED"),
            "n_steps_passed": n_passed,
            "all_steps_passed": n_passed == len(contract["replay_script"]["steps"]),
            "replay_basis": "recorded_trace",
            "comparator_tier": "A",
        },
    )


def add_job_records(
    receipts: Receipts,
    ended_at: str,
    log: dict[str, Any],
    seal: Seal,
    keys: list[PublicKey],
    ledger: list[LedgerRow],
) -> None:
    """affidavit's receipts: the event log's (``log``: its body), the seal's, the ledger's."""
    receipts.add(F.EVENT_LOG, ended_at, log)
    seal_key = {k.key_id: k for k in keys}[seal.key_id]
    receipts.add(
        F.SEAL, str(seal.sealed_at), {"seal": seal.to_dict(), "public_key": seal_key.public_key_b64}
    )
    rows = [
        {
            "idempotency_key": r.idempotency_key,
            "step_id": r.step_id,
            "status": r.status,
            "invocation_id": r.invocation_id,
            "result_hash": _result_hash(r.result),
        }
        for r in sorted(ledger, key=lambda r: r.idempotency_key)
    ]
    receipts.add(F.LEDGER, ended_at, {"rows": rows})


def _result_hash(result: Any) -> str | None:
    try:
        return F.sha256_hex(canonical(result))
    except AffidavitError:
        return None
