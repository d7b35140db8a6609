"""A small, real demonstration of the hash-chained event store (``affidavit demo``).

It records the events of a refund job on a fresh embedded database, recomputes the chain from
the stored bytes, then edits one stored payload behind the store's back — as an attacker or a
faulty migration would — and shows that the recomputation pins the edit to its version.
"""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from affidavit.core.canonical import canonical_sha256
from affidavit.core.chain import ChainCheck, check_stored_chain
from affidavit.core.events import utc_now
from affidavit.core.ids import new_attempt_id
from affidavit.core.plan import Plan, args_hash, external_key, idempotency_key
from affidavit.store import NewEvent, StoredEvent, open_store

REFUND_PLAN: dict[str, Any] = {
    "name": "refund-order",
    "nodes": [
        {
            "id": "lookup",
            "type": "tool",
            "tool": "lookup_order",
            "args": {"order_id": "${input.order_id}"},
        },
        {
            "id": "decide",
            "type": "pure",
            "tool": "decide_refund",
            "args": {"order": "${lookup}"},
            "depends_on": ["lookup"],
        },
        {
            "id": "refund",
            "type": "tool",
            "tool": "issue_refund",
            "args": {"order_id": "${input.order_id}", "amount": "${decide.amount}"},
            "depends_on": ["decide"],
        },
    ],
}


@dataclass(frozen=True)
class StoreDemoResult:
    db_path: str
    job_id: str
    events: list[StoredEvent]
    intact: ChainCheck
    tampered_version: int
    tampered: ChainCheck

    @property
    def ok(self) -> bool:
        return (
            self.intact.ok
            and self.intact.root == self.events[-1].chain_hash
            and not self.tampered.ok
            and self.tampered.first_bad_version == self.tampered_version
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "database": f"sqlite:///{self.db_path}",
            "job_id": self.job_id,
            "event_count": len(self.events),
            "event_chain_root_hash": self.intact.root,
            "intact_chain_ok": self.intact.ok,
            "tampered_version": self.tampered_version,
            "tamper_detected": not self.tampered.ok,
            "first_bad_version": self.tampered.first_bad_version,
        }


def _refund_job_events(plan: Plan, job_id: str) -> list[NewEvent]:
    order_input = {"order_id": "A-1001"}
    steps = plan.step_ids(job_id)
    attempt = new_attempt_id()
    events = [
        NewEvent(
            "plan_generated",
            {
                "at": utc_now(),
                "task_graph": dict(plan.task_graph),
                "plan_hash": plan.plan_hash,
                "policy": plan.policy.to_dict(),
            },
        )
    ]
    results = {
        "lookup": {"order_id": "A-1001", "total": 4200, "currency": "EUR", "paid": True},
        "decide": {"amount": 4200, "reason": "item arrived damaged"},
        "refund": {"refund_id": "rf_7", "amount": 4200, "status": "succeeded"},
    }
    resolved = {
        "lookup": order_input,
        "decide": {"order": results["lookup"]},
        "refund": {"order_id": "A-1001", "amount": 4200},
    }
    for node_id in plan.order:
        node = plan.node(node_id)
        step = steps[node_id]
        base = {"node_id": node_id, "step_id": step}
        events.append(
            NewEvent("node_started", {**base, "at": utc_now(), "attempt": 1, "worker_id": "demo"})
        )
        if node.type == "tool":
            assert node.tool is not None
            key = idempotency_key(job_id, step, node.tool, resolved[node_id])
            invocation = f"inv-{step}"
            events += [
                NewEvent(
                    "tool_invocation_started",
                    {
                        **base,
                        "at": utc_now(),
                        "invocation_id": invocation,
                        "tool_name": node.tool,
                        "idempotency_key": key,
                        "args_hash": args_hash(resolved[node_id]),
                        "attempt": 1,
                    },
                ),
                NewEvent(
                    "tool_invocation_finished",
                    {
                        **base,
                        "at": utc_now(),
                        "invocation_id": invocation,
                        "idempotency_key": key,
                        "outcome": "success",
                        "result": results[node_id],
                        "catch_up": False,
                    },
                ),
                NewEvent(
                    "command_committed",
                    {
                        **base,
                        "at": utc_now(),
                        "command_id": external_key(job_id, step, attempt),
                        "idempotency_key": key,
                        "result_hash": canonical_sha256(results[node_id]),
                    },
                ),
            ]
        finished: dict[str, Any] = {
            **base,
            "at": utc_now(),
            "result_type": "side_effect_committed" if node.type == "tool" else "pure",
            "attempt": 1,
            "duration_ms": 3,
        }
        if node.type != "tool":
            finished["output"] = results[node_id]
        events.append(NewEvent("node_finished", finished))
    events.append(
        NewEvent("job_completed", {"at": utc_now(), "output": {"refund": results["refund"]}})
    )
    return events


def _check(events: list[StoredEvent]) -> ChainCheck:
    return check_stored_chain(
        (e.version, e.event_id, e.type, e.payload_bytes, e.chain_hash) for e in events
    )


def run_store_demo(directory: str | None = None) -> StoreDemoResult:
    """Record a refund job's events in a fresh database under ``directory`` (a new temporary
    directory by default, kept for inspection), verify the chain, tamper, verify again."""
    folder = Path(directory or tempfile.mkdtemp(prefix="affidavit-demo-"))
    db_path = str(folder / "affidavit.db")
    plan = Plan.parse(REFUND_PLAN)
    store = open_store(f"sqlite:///{db_path}")
    try:
        job, _ = store.create_job(
            plan_name=plan.name,
            events=[
                NewEvent(
                    "job_created",
                    {
                        "at": utc_now(),
                        "input": {"order_id": "A-1001"},
                        "plan_name": plan.name,
                        "namespace": "default",
                        "submitted_by": "demo",
                        "idempotency_key": None,
                    },
                )
            ],
        )
        store.append(job.job_id, _refund_job_events(plan, job.job_id), expected_version=1)
        with store.transaction() as tx:
            tx.update_job(job.job_id, status="completed", output={"refund": "rf_7"})
        events = store.list_events(job.job_id)
        intact = _check(events)
        # Edit one stored payload directly in the file: the refund amount, 4200 -> 42000.
        target = next(
            e for e in events if e.type == "tool_invocation_finished" and b"rf_7" in e.payload_bytes
        )
        with sqlite3.connect(db_path) as raw:
            raw.execute(
                "UPDATE events SET payload = ? WHERE job_id = ? AND version = ?",
                (target.payload_bytes.replace(b"4200", b"42000"), job.job_id, target.version),
            )
        tampered = _check(store.list_events(job.job_id))
    finally:
        store.close()
    return StoreDemoResult(db_path, job.job_id, events, intact, target.version, tampered)
