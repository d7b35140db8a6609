"""The result of one pass: the fold's findings and the records read beside the log, run
through every check of the registry (:mod:`affidavit.verify._checks`) in order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from affidavit.core.seal import PublicKey, Seal
from affidavit.verify._checks import CHECKS
from affidavit.verify._fold import LogFold
from affidavit.verify._parts import printable
from affidavit.verify._proofs import Evidence
from affidavit.verify.result import VerificationResult


def assemble(
    fold: LogFold,
    *,
    status: str | None,
    row_errors: list[str],
    seal: Seal | None,
    keys: dict[str, PublicKey],
    seal_problem: str = "",
    job_row: Mapping[str, Any] | None = None,
) -> VerificationResult:
    ev = Evidence(fold, status, row_errors, seal, keys, seal_problem, job_row)
    parts = {c.name: c.run(ev) for c in CHECKS}  # (in order: see affidavit.verify._proofs)
    return VerificationResult(job_id=fold.job_id, status=printable(ev.shown_status), **parts)
