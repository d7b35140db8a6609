"""Rebuild a job's state from its event log — the log is the authority.

:func:`build_from_events` is pure (no I/O) and deterministic: the same events give equal
contexts. The runner uses it to skip finished nodes and inject recorded results; Verification
Mode uses it to check the log's invariants.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.events import COMPLETED_RESULT_TYPES
from affidavit.store.base import StoredEvent


@dataclass
class Invocation:
    """What the log says about one idempotency key."""

    key: str
    node_id: str
    step_id: str
    tool_name: str
    started: list[dict[str, Any]] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)
    committed: bool = False

    @property
    def pending(self) -> dict[str, Any] | None:
        """The last ``tool_invocation_started`` not closed by a ``tool_invocation_finished``."""
        closed = {f["invocation_id"] for f in self.finished}
        open_ = [s for s in self.started if s["invocation_id"] not in closed]
        return open_[-1] if open_ else None

    @property
    def result(self) -> Any:
        for f in reversed(self.finished):
            if f["outcome"] == "success":
                return f.get("result")
        return None


@dataclass
class ReplayContext:
    job_id: str | None = None
    input: Any = None
    namespace: str | None = None
    task_graph: dict[str, Any] | None = None
    plan_hash: str | None = None
    policy: dict[str, Any] | None = None
    node_finished: dict[str, dict[str, Any]] = field(default_factory=dict)  # latest per node
    node_attempts: dict[str, int] = field(default_factory=dict)
    finish_order: list[tuple[str, str]] = field(default_factory=list)  # (node_id, result_type)
    invocations: dict[str, Invocation] = field(default_factory=dict)
    committed_commands: dict[str, str] = field(default_factory=dict)  # command_id -> key
    state_changes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by step
    waits: dict[str, dict[str, Any]] = field(default_factory=dict)  # correlation key -> wait
    completed_waits: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: str = "pending"
    output: Any = None
    error: Any = None
    resumptions: list[dict[str, Any]] = field(default_factory=list)
    event_count: int = 0

    @property
    def completed_nodes(self) -> set[str]:
        return {
            n for n, f in self.node_finished.items() if f["result_type"] in COMPLETED_RESULT_TYPES
        }

    @property
    def completed_tool_invocations(self) -> dict[str, Any]:
        return {k: inv.result for k, inv in self.invocations.items() if inv.committed}

    @property
    def pending_tool_invocations(self) -> dict[str, dict[str, Any]]:
        return {k: p for k, inv in self.invocations.items() if (p := inv.pending) is not None}

    def node_output(self, node_id: str) -> Any:
        """The recorded output of a completed node: a pure/wait node's ``output``, a tool
        node's committed result."""
        finished = self.node_finished[node_id]
        if "output" in finished:
            return finished["output"]
        for inv in self.invocations.values():
            if inv.node_id == node_id and inv.committed:
                return inv.result
        return None


def build_from_events(events: Iterable[StoredEvent]) -> ReplayContext:
    """Fold the log into a :class:`ReplayContext`."""
    ctx = ReplayContext()
    for event in events:
        ctx.event_count += 1
        ctx.job_id = event.job_id
        p = event.payload
        t = event.type
        if t == "job_created":
            ctx.input = p.get("input")
            ctx.namespace = p.get("namespace")
        elif t == "plan_generated":
            ctx.task_graph = p.get("task_graph")
            ctx.plan_hash = p.get("plan_hash")
            ctx.policy = p.get("policy")
        elif t == "node_started":
            ctx.node_attempts[p["node_id"]] = max(
                ctx.node_attempts.get(p["node_id"], 0), int(p.get("attempt", 1))
            )
            if ctx.status in ("pending", "parked", "waiting"):
                ctx.status = "running"
        elif t == "tool_invocation_started":
            inv = ctx.invocations.get(p["idempotency_key"])
            if inv is None:
                inv = ctx.invocations[p["idempotency_key"]] = Invocation(
                    p["idempotency_key"], p["node_id"], p["step_id"], p["tool_name"]
                )
            inv.started.append(p)
        elif t == "tool_invocation_finished":
            inv = ctx.invocations.get(p["idempotency_key"])
            if inv is None:  # finished without started: kept so verification can flag it
                inv = ctx.invocations[p["idempotency_key"]] = Invocation(
                    p["idempotency_key"], p["node_id"], p["step_id"], ""
                )
            inv.finished.append(p)
        elif t == "command_committed":
            ctx.committed_commands[p["command_id"]] = p.get("idempotency_key") or ""
            key = p.get("idempotency_key")
            if key and key in ctx.invocations:
                ctx.invocations[key].committed = True
        elif t == "state_changed":
            ctx.state_changes.setdefault(p["step_id"], []).extend(p["state_changes"])
        elif t == "node_finished":
            ctx.node_finished[p["node_id"]] = p
            ctx.finish_order.append((p["node_id"], p["result_type"]))
        elif t == "job_waiting":
            ctx.waits[p["correlation_key"]] = p
            ctx.status = "waiting"
        elif t == "wait_completed":
            ctx.completed_waits[p["correlation_key"]] = p
            ctx.status = "running"
        elif t == "job_parked":
            ctx.status = "parked"
        elif t == "job_resumed":
            ctx.resumptions.append(p)
            ctx.status = "pending"
        elif t == "job_completed":
            ctx.status = "completed"
            ctx.output = p.get("output")
        elif t == "job_failed":
            ctx.status = "failed"
            ctx.error = p.get("error")
        elif t == "job_cancelled":
            ctx.status = "cancelled"
    return ctx
