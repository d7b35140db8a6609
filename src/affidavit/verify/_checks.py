"""The checks of Verification Mode, in one registry that the verifier, the result and the
faces read.

Each :class:`CheckDef` says what the check is called (its key in the result object of
docs/formats.md §6, and its row in ``affidavit verify``'s table), what it proves (the column of
the table in docs/verification.md "The checks"), how it is computed from what the pass gathered
(:mod:`affidavit.verify._proofs`), whether it holds, how it reads in the report (why it holds or
fails: the CLI's table, the proof pack's errors) and in the result object. The verifier runs
``CHECKS`` in order; :class:`~affidavit.verify.result.VerificationResult` serializes, judges and
reports them in that order. docs/verification.md "Adding a proof" says what else a new one needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from affidavit.verify import _proofs
from affidavit.verify._parts import LedgerProof, ReplayProof, SealCheck, StoredChainCheck

P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class CheckDef(Generic[P]):
    """One check: ``run`` computes its part of the result, ``ok``, ``detail`` and ``to_json``
    read that part. A check that is not a ``proof`` reports a value (a hash), which holds
    whatever it is and does not count in the verdict; the values stand for the record only when
    every ``record`` check holds (else they are those of the rows as they are now)."""

    name: str
    proves: str
    run: Callable[[_proofs.Evidence], P]
    ok: Callable[[P], bool]
    detail: Callable[[P], str]
    to_json: Callable[[P], Any]
    proof: bool = True
    record: bool = False


def _value(value: str) -> str:
    return value


def _holds(_: str) -> bool:
    return True


def _short(keys: tuple[str, ...]) -> str:
    return ", ".join(k[:16] + "…" for k in keys)


def _ledger_detail(ledger: LedgerProof) -> str:
    pending = ledger.pending_idempotency_keys
    if not ledger.ok:
        detail = "; ".join(ledger.errors) or "failed"
    elif pending:
        detail = f"{len(pending)} invocation(s) in flight: " + _short(pending)
    else:
        detail = "every started invocation closed once; ledger agrees with the log"
    if ledger.ok and ledger.unknown_outcome_keys:
        detail += (
            f"; {len(ledger.unknown_outcome_keys)} invocation(s) of unknown outcome (the "
            "tool may or may not have acted): " + _short(ledger.unknown_outcome_keys)
        )
    return detail


def _replay_detail(replay: ReplayProof) -> str:
    return replay.error or "the log replays consistently"


def _chain_detail(chain: StoredChainCheck) -> str:
    if chain.ok:
        return f"{chain.event_count} events, every stored hash recomputes"
    return f"first bad version: {chain.first_bad_version}"


def _seal_detail(seal: SealCheck) -> str:
    if seal.ok and seal.present:
        return f"signed by {seal.key_id} over {seal.event_count} events"
    if seal.ok:
        return "not sealed yet (the job is not terminal)"
    return seal.error


def _ok(part: LedgerProof | ReplayProof | StoredChainCheck | SealCheck) -> bool:
    return part.ok


def _json(part: LedgerProof | ReplayProof | StoredChainCheck | SealCheck) -> dict[str, Any]:
    return part.to_dict()


CHECKS: tuple[CheckDef[Any], ...] = (
    CheckDef(
        "execution_hash",
        "the path the job took",
        _proofs.execution_hash,
        _holds,
        _value,
        _value,
        proof=False,
    ),
    CheckDef(
        "event_chain_root_hash",
        "the log's content and order",
        _proofs.chain_root,
        _holds,
        _value,
        _value,
        proof=False,
    ),
    CheckDef(
        "tool_invocation_ledger_proof",
        "at most once",
        _proofs.ledger_proof,
        _ok,
        _ledger_detail,
        _json,
    ),
    CheckDef(
        "replay_proof_result",
        "the log replays into a consistent state",
        _proofs.replay_proof,
        _ok,
        _replay_detail,
        _json,
    ),
    CheckDef(
        "stored_chain",
        "every stored `chain_hash` recomputes",
        _proofs.stored_chain,
        _ok,
        _chain_detail,
        _json,
        record=True,
    ),
    CheckDef(
        "seal",
        "the log has not been truncated or re-chained since the job finished (a v2 seal: and "
        "its `events_root` is the Merkle root of the recomputed chain hashes)",
        _proofs.seal_check,
        _ok,
        _seal_detail,
        _json,
        record=True,
    ),
)
