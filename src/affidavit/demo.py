"""``affidavit demo``: the refund agent end to end, with a crash and its recovery.

(1) A fresh embedded database and a small shop in a new temporary directory.
(2) Job 1 runs cleanly in this process.
(3) Job 2 runs in a child process that is killed (SIGKILL) right after the refund was paid but
    before the payment was recorded (crash point ``tool.after_execute``).
(4) A worker in this process reclaims job 2 when its lease expires; the refund tool's
    ``reconcile`` finds the payment by its idempotency key, so it is recorded, not repeated.
(5) The real world is counted: refunds in the payments ledger and e-mails in the outbox.
(5a) The same refund runs as an agent (``refund.refund_agent``: a scripted decision function
    picks each next tool, no network): order A-1003 cleanly; order A-1004 in a child process
    killed right after the payment, as job 2 was, then recovered — the function runs again
    from the top, its recorded calls return their recorded results without executing, and
    ``reconcile`` finds the payment. The counts show one refund and one e-mail per order.
(6) Every job's hash chain is recomputed from the stored bytes and every job is verified
    (Verification Mode: proofs, stored chain, seal); then a copy of the database is tampered
    with (a refund amount changed): the recomputation pins the edit to its event and
    verification of the copy fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from affidavit.core.chain import ChainCheck, check_stored_chain
from affidavit.examples import refund
from affidavit.runtime import Runtime
from affidavit.store import StoredEvent, forged_copy, open_store
from affidavit.verify import VerificationResult, verify_events, verify_job

CRASH_AT = "tool.after_execute:2"  # the 2nd tool to return: issue_refund (after lookup_order)
LEASE_SECONDS = 1.0


@dataclass
class DemoJob:
    order_id: str
    job_id: str
    status: str
    crashed: bool
    events: list[StoredEvent]
    chain: ChainCheck
    verification: VerificationResult  # Verification Mode: the four proofs, stored chain, seal
    agent: bool = False  # run as an agent (refund.refund_agent), not as the plan


@dataclass
class DemoResult:
    directory: str
    database: str
    jobs: list[DemoJob]  # plan jobs, then agent jobs (``agent``)
    refunds: Counter[str]
    emails: Counter[str]
    child_returncode: int
    agent_child_returncode: int
    tampered_version: int
    tamper_check: ChainCheck
    tamper_verification: VerificationResult
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            all(j.status == "completed" and j.chain.ok and j.verification.ok for j in self.jobs)
            and all(self.refunds[j.order_id] == 1 for j in self.jobs)
            and all(self.emails[j.order_id] == 1 for j in self.jobs)
            and self.child_returncode == -9
            and self.agent_child_returncode == -9
            and not self.tamper_check.ok
            and self.tamper_check.first_bad_version == self.tampered_version
            and not self.tamper_verification.ok
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "directory": self.directory,
            "database": self.database,
            "jobs": [
                {
                    "order_id": j.order_id,
                    "job_id": j.job_id,
                    "status": j.status,
                    "crashed_and_recovered": j.crashed,
                    "kind": "agent" if j.agent else "plan",
                    "event_count": len(j.events),
                    "event_chain_root_hash": j.chain.root,
                    "chain_ok": j.chain.ok,
                    "verified": j.verification.ok,
                    "execution_hash": j.verification.execution_hash,
                    "seal_key_id": j.verification.seal.key_id,
                    "refunds_paid": self.refunds[j.order_id],
                    "emails_sent": self.emails[j.order_id],
                }
                for j in self.jobs
            ],
            "crash": {
                "point": CRASH_AT,
                "child_returncode": self.child_returncode,
                "agent_child_returncode": self.agent_child_returncode,
            },
            "tamper": {
                "edited_version": self.tampered_version,
                "detected": not self.tamper_check.ok,
                "first_bad_version": self.tamper_check.first_bad_version,
                "verified": self.tamper_verification.ok,
            },
            "seconds": round(self.seconds, 2),
        }


def _check(events: list[StoredEvent]) -> ChainCheck:
    return check_stored_chain(
        (e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash) for e in events
    )


def _count_world(data_dir: Path) -> tuple[Counter[str], Counter[str]]:
    refunds = Counter(e["order_id"] for e in refund.PaymentsLedger(data_dir).entries())
    emails: Counter[str] = Counter()
    for eml in (data_dir / "outbox").glob("*.eml"):
        subject = next(line for line in eml.read_text().splitlines() if line.startswith("Subject"))
        emails[subject.rsplit(" ", 1)[-1]] += 1
    return refunds, emails


def _tamper_file(
    db_path: Path, root: Path, job_id: str, target: StoredEvent, forged: bytes
) -> tuple[ChainCheck, VerificationResult]:
    """Edit the event in a copy of the SQLite file, as anyone with the file could."""
    tampered_db = root / "tampered-copy.db"
    forged_copy(db_path, tampered_db, job_id, target.version, forged)
    copy = open_store(f"sqlite:///{tampered_db}")
    try:
        return _check(copy.list_events(job_id)), verify_job(copy, job_id)
    finally:
        copy.close()


def _tamper_export(
    url: str, job: DemoJob, target: StoredEvent, forged: bytes
) -> tuple[ChainCheck, VerificationResult]:
    """Edit the event in an exported copy of the job (events, ledger, seal), verified offline
    with :func:`~affidavit.verify.verify_events` — the database itself is left alone."""
    events = [replace(e, payload_bytes=forged) if e is target else e for e in job.events]
    store = open_store(url, read_only=True)
    try:
        with store.snapshot() as snap:
            ledger = snap.ledger_list(job.job_id)
        seal, keys = store.get_seal(job.job_id), store.signing_keys()
    finally:
        store.close()
    verification = verify_events(
        events, public_keys=keys, seal=seal, ledger=ledger, status=job.status, job_id=job.job_id
    )
    return _check(events), verification


# The agent's run that dies between paying and recording the payment (crash point as for job 2:
# the 2nd tool to return is issue_refund; the scripted model and decide_refund are pure steps).
_AGENT_CHILD = """
import json, sys
from affidavit.examples import refund
from affidavit.runtime._runtime import Runtime
url, job_input, key, lease = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], float(sys.argv[4])
with Runtime(url, tools=refund.TOOLS, lease_seconds=lease) as rt:
    rt.run_job(rt.submit(refund.refund_agent, job_input, idempotency_key=key).job_id)
"""


def _agent_runs(
    url: str, root: Path, data_dir: Path, lease_seconds: float
) -> tuple[int, list[DemoJob]]:
    """Step (5a): the refund as an agent, order A-1003 cleanly, order A-1004 killed after the
    payment and recovered here. Returns the killed child's exit code and the two jobs."""
    crash_key = f"agent-refund-A-1004-{root.name}"
    with Runtime(url, tools=refund.TOOLS, lease_seconds=lease_seconds) as rt:
        clean = rt.submit(refund.refund_agent, {"order_id": "A-1003", "data_dir": str(data_dir)})
        rt.run_job(clean.job_id)
    env = {**os.environ, "AFFIDAVIT_CRASH_AT": CRASH_AT}
    env.pop("AFFIDAVIT_DATABASE_URL", None)
    crashed_input = {"order_id": "A-1004", "data_dir": str(data_dir)}
    child = subprocess.run(
        [sys.executable, "-c", _AGENT_CHILD, url, json.dumps(crashed_input), crash_key,
         str(lease_seconds)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    with Runtime(url, tools=refund.TOOLS, lease_seconds=lease_seconds) as rt:
        crashed = rt.submit(refund.refund_agent, crashed_input, idempotency_key=crash_key)
        deadline = time.monotonic() + 30
        while not rt.run_job(crashed.job_id).terminal and time.monotonic() < deadline:
            time.sleep(0.1)  # the killed run's lease has not expired yet
        jobs = []
        for order_id, job_id, was_killed in (
            ("A-1003", clean.job_id, False),
            ("A-1004", crashed.job_id, True),
        ):
            events = rt.store.list_events(job_id)
            status = rt.get_job(job_id).status
            check, verified = _check(events), verify_job(rt.store, job_id)
            jobs.append(
                DemoJob(order_id, job_id, status, was_killed, events, check, verified, True)
            )
    return child.returncode, jobs


def _plan_runs(
    url: str, root: Path, data_dir: Path, lease_seconds: float
) -> tuple[subprocess.CompletedProcess[str], list[DemoJob]]:
    """Steps (2)-(4): the refund as a plan, one clean run and one killed (in a child process)
    between paying and recording the payment, then recovered; the child and both jobs."""
    crash_key = f"refund-A-1002-{root.name}"
    plan_file = root / "refund-plan.json"
    plan_file.write_text(json.dumps(refund.PLAN, indent=2))

    # (2) a clean run
    with Runtime(url, tools=refund.TOOLS, lease_seconds=lease_seconds) as rt:
        first = rt.submit(refund.PLAN, {"order_id": "A-1001", "data_dir": str(data_dir)})
        rt.run_job(first.job_id)

    # (3) a run that dies between paying and recording the payment
    env = {**os.environ, "AFFIDAVIT_CRASH_AT": CRASH_AT}
    env.pop("AFFIDAVIT_DATABASE_URL", None)
    child = subprocess.run(
        [
            sys.executable, "-m", "affidavit", "run", str(plan_file),
            "--tools", "affidavit.examples.refund",
            "--input", json.dumps({"order_id": "A-1002", "data_dir": str(data_dir)}),
            "--idempotency-key", crash_key,
            "--lease-seconds", str(lease_seconds), "--db", url, "--json",
        ],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip

    # (4) recovery: wait out the dead worker's lease, then a worker reclaims the job
    with Runtime(url, tools=refund.TOOLS, lease_seconds=lease_seconds) as rt:
        second = rt.submit(
            refund.PLAN,
            {"order_id": "A-1002", "data_dir": str(data_dir)},
            idempotency_key=crash_key,
        )
        deadline = time.monotonic() + 30
        # only the demo's own job: a database given with --db may hold others
        while not rt.run_job(second.job_id).terminal and time.monotonic() < deadline:
            time.sleep(0.1)  # the killed run's lease has not expired yet
        jobs: list[DemoJob] = []
        for order_id, job_id, crashed in (
            ("A-1001", first.job_id, False),
            ("A-1002", second.job_id, True),
        ):
            events = rt.store.list_events(job_id)
            jobs.append(
                DemoJob(
                    order_id,
                    job_id,
                    rt.get_job(job_id).status,
                    crashed,
                    events,
                    _check(events),
                    verify_job(rt.store, job_id),
                )
            )
    return child, jobs


def run_demo(
    directory: str | None = None, *, db_url: str | None = None, lease_seconds: float = LEASE_SECONDS
) -> DemoResult:
    """Run the demonstration in ``directory`` (a new temporary directory by default, kept so
    it can be inspected), on a fresh SQLite file there — or on the database ``db_url`` (its
    jobs are left there; this run's idempotency key is its own, so runs do not meet).
    ``lease_seconds``: the lease of the workers, and so how long the recovery waits for the
    killed run's lease to expire."""
    started = time.perf_counter()
    root = Path(directory or tempfile.mkdtemp(prefix="affidavit-demo-"))
    data_dir = refund.setup_shop(root / "shop")
    db_path = root / "affidavit.db"
    url = db_url if db_url is not None else f"sqlite:///{db_path}"
    child, jobs = _plan_runs(url, root, data_dir, lease_seconds)

    # (5a) the refund as an agent: one clean, one killed after the payment and recovered
    agent_code, agent_jobs = _agent_runs(url, root, data_dir, lease_seconds)
    jobs += agent_jobs

    # (5) the real world
    refunds, emails = _count_world(data_dir)

    # (6) tamper with a copy: change job 1's refund amount
    target = next(
        e for e in jobs[0].events
        if e.type == "tool_invocation_finished" and b"refund_id" in e.payload_bytes
    )  # fmt: skip
    amount = str(target.payload["result"]["amount"]).encode()
    forged = target.payload_bytes.replace(amount, amount + b"0")
    if db_url is None:
        tampered = _tamper_file(db_path, root, jobs[0].job_id, target, forged)
    else:
        tampered = _tamper_export(url, jobs[0], target, forged)
    tamper_check, tamper_verification = tampered
    notes = [] if child.returncode == -9 else [f"child exited {child.returncode}: {child.stderr}"]
    if agent_code != -9:
        notes.append(f"the agent's child exited {agent_code}")
    return DemoResult(
        directory=str(root),
        database=url,
        jobs=jobs,
        refunds=refunds,
        emails=emails,
        child_returncode=child.returncode,
        agent_child_returncode=agent_code,
        tampered_version=target.version,
        tamper_check=tamper_check,
        tamper_verification=tamper_verification,
        seconds=time.perf_counter() - started,
        notes=notes,
    )
