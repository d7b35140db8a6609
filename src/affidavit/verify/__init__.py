"""Verification Mode: the read-only proofs over a job's record (docs/verification.md)."""

from __future__ import annotations

from affidavit.verify._batch import (
    verification_document,
    verify_all,
    verify_one,
    verify_one_fork,
)
from affidavit.verify._checks import CHECKS, CheckDef
from affidavit.verify._fork import ForkCheck, check_fork, check_reuse
from affidavit.verify._tree import TreeLink, TreeResult, verify_tree
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
    "verification_document",
    "verify_all",
    "verify_events",
    "verify_job",
    "verify_one",
    "verify_one_fork",
    "verify_orphans",
    "verify_tree",
]
