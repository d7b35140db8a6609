"""Data subjects and their erasure: ``affidavit subjects`` and ``affidavit erase``.

A job submitted with a subject has the values a person or an agent supplies sealed under the
subject's data key (:mod:`affidavit.core.privacy`); erasing the subject destroys that key while
every proof of its jobs still verifies, and leaves a signed, logged receipt. See
docs/privacy.md.
"""

from __future__ import annotations

from affidavit.privacy._erase import (
    Erasure,
    check_reason,
    erase,
    find_subject,
    stored_receipt,
    subject_id,
    with_log_proof,
)
from affidavit.privacy._receipt import (
    LEAF_TYPE,
    MAX_RECEIPT_BYTES,
    RECEIPT_TYPE,
    ReceiptCheck,
    log_leaf,
    parse_receipt,
    verify_receipt,
)
from affidavit.privacy._views import list_subjects, show_subject, subject_document

__all__ = [
    "LEAF_TYPE",
    "MAX_RECEIPT_BYTES",
    "RECEIPT_TYPE",
    "Erasure",
    "ReceiptCheck",
    "check_reason",
    "erase",
    "find_subject",
    "list_subjects",
    "log_leaf",
    "parse_receipt",
    "show_subject",
    "stored_receipt",
    "subject_document",
    "subject_id",
    "verify_receipt",
    "with_log_proof",
]
