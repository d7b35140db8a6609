"""Verification Mode: the read-only proofs over a job's record (docs/verification.md). Each
name is imported on first use, so that the pack verifier's replay of a log loads no other proof."""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.core.lazy import lazy_exports

if TYPE_CHECKING:
    from affidavit.verify._batch import (
        verification_document,
        verify_all,
        verify_one,
        verify_one_fork,
    )
    from affidavit.verify._checks import CHECKS, CheckDef
    from affidavit.verify._fork import ForkCheck, check_fork, check_reuse
    from affidavit.verify._tree import TreeLink, TreeResult, child_result_problem, verify_tree
    from affidavit.verify._trust_log import TrustLogCheck, check_trust_log
    from affidavit.verify.result import (
        Check,
        LedgerProof,
        ReplayProof,
        SealCheck,
        StoredChainCheck,
        VerificationResult,
    )
    from affidavit.verify.verification import verify_events, verify_job, verify_orphans

_LAZY = {
    "verify_all": "affidavit.verify._batch",
    "verify_one": "affidavit.verify._batch",
    "verify_one_fork": "affidavit.verify._batch",
    "verification_document": "affidavit.verify._batch",
    "CHECKS": "affidavit.verify._checks",
    "CheckDef": "affidavit.verify._checks",
    "ForkCheck": "affidavit.verify._fork",
    "check_fork": "affidavit.verify._fork",
    "check_reuse": "affidavit.verify._fork",
    "TreeLink": "affidavit.verify._tree",
    "TreeResult": "affidavit.verify._tree",
    "child_result_problem": "affidavit.verify._tree",
    "verify_tree": "affidavit.verify._tree",
    "TrustLogCheck": "affidavit.verify._trust_log",
    "check_trust_log": "affidavit.verify._trust_log",
    "Check": "affidavit.verify.result",
    "LedgerProof": "affidavit.verify.result",
    "ReplayProof": "affidavit.verify.result",
    "SealCheck": "affidavit.verify.result",
    "StoredChainCheck": "affidavit.verify.result",
    "VerificationResult": "affidavit.verify.result",
    "verify_events": "affidavit.verify.verification",
    "verify_job": "affidavit.verify.verification",
    "verify_orphans": "affidavit.verify.verification",
}

__getattr__ = lazy_exports("affidavit.verify", _LAZY, globals())

__all__ = [
    "CHECKS",
    "Check",
    "CheckDef",
    "ForkCheck",
    "LedgerProof",
    "ReplayProof",
    "SealCheck",
    "StoredChainCheck",
    "TreeLink",
    "TreeResult",
    "TrustLogCheck",
    "VerificationResult",
    "check_fork",
    "check_reuse",
    "check_trust_log",
    "child_result_problem",
    "verification_document",
    "verify_all",
    "verify_events",
    "verify_job",
    "verify_one",
    "verify_one_fork",
    "verify_orphans",
    "verify_tree",
]
