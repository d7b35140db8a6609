"""Sealing jobs that finished before seals existed (databases created before migration 0005).

A new job is sealed in the transaction of its terminal event, so this is never needed for it. A
seal made afterwards attests the log as it is *now* (its ``sealed_at`` says when); that is why
every log is verified first and a job whose record does not verify is not sealed — sealing it
would launder the damage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from affidavit.core.seal import Seal
from affidavit.record import Sealer
from affidavit.store import TERMINAL_STATUSES, JobFilter, Store
from affidavit.verify.verification import verify_job


@dataclass
class RepairReport:
    sealed: list[Seal] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # job id -> why it was not sealed


def seal_unsealed(store: Store, sealer: Sealer, *, limit: int = 10_000) -> RepairReport:
    """Seal every terminal job (up to ``limit``, newest first) that has no seal and whose log,
    ledger and status verify; report the ones refused and why."""
    report = RepairReport()
    jobs = store.list_jobs(JobFilter(status=sorted(TERMINAL_STATUSES), limit=limit))
    for job in jobs:
        if store.get_seal(job.job_id) is not None:
            continue
        result = verify_job(store, job.job_id)
        failed = [c for c in result.checks() if not c.ok and c.name != "seal"]
        if failed:
            report.refused[job.job_id] = "; ".join(f"{c.name}: {c.detail}" for c in failed)
            continue
        seal = sealer.seal_job(store, job.job_id)
        if seal is not None:
            report.sealed.append(seal)
    return report
