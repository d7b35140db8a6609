"""An agent job's trace: the sequence of its recorded calls, read from the log.

An agent job has no plan to draw; its trace lists each step — one per recording ``ctx.*`` call,
in sequence order — with its kind, tool, state, outcome, attempts, duration and waits. The
states, and the ladder that picks one, are the plan trace's (:mod:`affidavit.record._states`),
so the same colours apply. Read
from the events alone (no agent code, no runtime replay), as ``affidavit jobs trace``,
``GET /api/jobs/{id}/trace``, the trace page and the proof pack see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.core.errors import ReplayError
from affidavit.core.events import COMPLETED_RESULT_TYPES
from affidavit.record._recovered import read_attempts
from affidavit.record._states import (
    ANSWERED_STATES,
    NodeFacts,
    is_denial,
    lease_live,
    node_state,
)
from affidavit.store import JobRecord, StoredEvent


@dataclass(frozen=True, slots=True)
class AgentOutcome:
    """How the log says the job ended: ``status`` (``pending`` … ``cancelled``), the
    function's return (``output``) of a completed job, the ``error`` of a failed one."""

    status: str
    output: Any = None
    error: Any = None


_ANSWERED = frozenset(ANSWERED_STATES.values())


def is_agent_log(events: Sequence[StoredEvent]) -> bool:
    """Whether ``events`` are an agent job's log: its ``job_created`` says ``"kind": "agent"``.

    Raises:
        ReplayError: the first payload is not JSON.
    """
    if not events or events[0].type != "job_created":
        return False
    payload = _payload(events[0])
    return isinstance(payload, dict) and payload.get("kind") == "agent"


def _payload(event: StoredEvent) -> Any:
    return event.payload  # (UnreadableEventError, a ReplayError: not JSON)


class _Steps:
    """The per-step state gathered in one pass over the log."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}  # node id -> the step, in sequence order
        self.finished: dict[str, dict[str, Any]] = {}  # the latest node_finished per step
        self.results: dict[str, Any] = {}  # key -> the result of its successful invocation
        self.committed: dict[str, Any] = {}  # node -> its committed result
        self.open_keys: dict[str, str] = {}  # key -> node, invocations open
        self.open_waits: dict[str, str] = {}  # correlation key -> node, waits not answered
        self.signalled: set[str] = set()  # steps whose wait was answered
        self.unknown: set[str] = set()  # steps whose last call was closed as `unknown`
        self.parked: dict[str, Any] | None = None
        self.warnings: list[dict[str, Any]] = []
        self.agent: dict[str, Any] = {}
        self.outcome = AgentOutcome("pending")

    def step(self, p: dict[str, Any], version: int) -> dict[str, Any]:
        node = self.nodes.get(p.get("node_id", ""))
        if node is None:
            raise ReplayError(
                f"an event of step {p.get('node_id')!r}, which no step_called opened",
                version=version,
            )
        return node

    def read(self, e: StoredEvent) -> None:
        p = _payload(e)
        if not isinstance(p, dict):
            raise ReplayError("the payload is not an object", version=e.version)
        kind, at = e.type, p.get("at")
        if kind == "agent_started":
            self.agent = {
                "name": p.get("agent"),
                "version": p.get("agent_version"),
                "agent_hash": p.get("agent_hash"),
                "code_sha256": p.get("code_sha256"),
                "policy": p.get("policy"),
            }
        elif kind == "step_called":
            node_id = p.get("node_id")
            if not isinstance(node_id, str) or node_id in self.nodes:
                raise ReplayError(f"step_called names step {node_id!r} again", version=e.version)
            self.nodes[node_id] = {
                "id": node_id,
                "seq": p.get("seq"),
                "type": p.get("kind"),
                "tool": p.get("tool_name"),
                "depends_on": [],
                "step_id": p.get("step_id"),
                "args_hash": p.get("args_hash"),
                "code_sha256": p.get("code_sha256"),  # the code that called it
                "called_at": at,
                "started_at": None,
                "finished_at": None,
                "duration_ms": None,
                "attempts": 0,
                "tries": [],
                "waits": [],
            }
        elif kind == "node_started":
            node = self.step(p, e.version)
            if node["started_at"] is None:
                node["started_at"] = at
            node["attempts"] = max(node["attempts"], _int(p.get("attempt")))
        elif kind == "tool_invocation_started":
            self.open_keys[str(p.get("idempotency_key"))] = self.step(p, e.version)["id"]
        elif kind == "tool_invocation_finished":
            key = str(p.get("idempotency_key"))
            node_id = self.open_keys.pop(key, None)
            if node_id is not None and p.get("outcome") == "unknown":
                self.unknown.add(node_id)  # (it may or may not have acted)
            if p.get("outcome") == "success":
                self.results[key] = p.get("result")
        elif kind == "command_committed":
            node = self.step(p, e.version)
            self.committed[node["id"]] = self.results.get(str(p.get("idempotency_key")))
        elif kind == "node_finished":
            self._finished(self.step(p, e.version), p, e.version)
        elif kind == "job_waiting":
            node = self.step(p, e.version)
            key = str(p.get("correlation_key"))
            wait = {"correlation_key": key, "wait_type": p.get("wait_type"), "since": at}
            if p.get("wake_at") is not None:
                wait["wake_at"] = p.get("wake_at")
            node["waits"].append(wait)
            self.open_waits[key] = node["id"]
        elif kind == "wait_completed":
            key = str(p.get("correlation_key"))
            node_id = self.open_waits.pop(key, None)
            if node_id is not None:
                self.signalled.add(node_id)
                for wait in self.nodes[node_id]["waits"]:
                    if wait["correlation_key"] == key:
                        wait.update(answered_at=at, signalled_by=p.get("signalled_by"))
        elif kind == "job_parked":
            shown = {k: v for k, v in p.items() if k != "at"}
            self.parked = {"version": e.version, **shown}
        elif kind == "job_resumed":
            self.parked = None
        elif kind == "confirmation_warning":
            self.warnings.append({k: v for k, v in p.items() if k != "at"})
        elif kind == "job_completed":
            self.outcome = AgentOutcome("completed", output=p.get("output"))
        elif kind == "job_failed":
            self.outcome = AgentOutcome("failed", error=p.get("error"))
        elif kind == "job_cancelled":
            self.outcome = AgentOutcome("cancelled")

    def _finished(self, node: dict[str, Any], p: dict[str, Any], version: int) -> None:
        self.finished[node["id"]] = p
        node["finished_at"] = p.get("at")
        duration = p.get("duration_ms", 0)
        number = float(duration) if isinstance(duration, int | float) else 0.0
        node["duration_ms"] = (node["duration_ms"] or 0.0) + number
        node["attempts"] = max(node["attempts"], _int(p.get("attempt")))
        node["tries"].append(
            {
                "attempt": p.get("attempt"),
                "result_type": p.get("result_type"),
                "at": p.get("at"),
                "duration_ms": p.get("duration_ms"),
                "error": p.get("error"),
                "version": version,
            }
        )


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def agent_trace_of(
    job: JobRecord, events: Sequence[StoredEvent], *, now: float | None = None
) -> tuple[dict[str, Any], AgentOutcome]:
    """The trace of the agent job ``job`` from its log ``events`` (all of them, in version
    order), and how the log says it ended. ``now`` as for
    :func:`~affidavit.record._trace.trace_of`. A wait or approval step carries ``key``, the
    key it waits on (what people know it by: ``big_refund``, not ``#2``).

    Raises:
        ReplayError: the log cannot be read as an agent job's (a payload that is not JSON, an
            event of a step no ``step_called`` opened).
    """
    steps = _Steps()
    for e in events:
        steps.read(e)
    in_flight = {node: key for key, node in steps.open_keys.items()}
    waiting = {node: key for key, node in steps.open_waits.items()}
    parked_node = steps.parked.get("node_id") if steps.parked else None
    attempts = read_attempts(events)
    live = lease_live(job, now)
    nodes = []
    for node_id, node in steps.nodes.items():
        finished = steps.finished.get(node_id)
        outcome = finished.get("result_type") if finished else None
        wait_type = node["waits"][-1]["wait_type"] if node["waits"] else None
        facts = NodeFacts(
            outcome=outcome,
            completed=outcome in COMPLETED_RESULT_TYPES,
            finished=finished is not None,
            started=node["started_at"] is not None,
            in_flight=node_id in in_flight,
            waiting=node_id in waiting,
            unknown=node_id in steps.unknown,
            signalled=node_id in steps.signalled,
            parked_on=parked_node == node_id,
            answered=ANSWERED_STATES.get(str(wait_type)) if node_id in steps.signalled else None,
            denied=node["type"] == "approval" and is_denial(finished),
            call_live=live and attempts.last_worker(node_id) == job.lease_owner,
        )
        state = node_state(facts, job)
        shown = {**node, "state": state, "outcome": outcome}
        shown["tries"] = [
            {**t, "worker_id": attempts.worker_of(node_id, t["attempt"])} for t in node["tries"]
        ]
        shown["recovered"] = attempts.recovered.get(node_id, [])
        if node["waits"]:
            shown["key"] = node["waits"][-1]["correlation_key"]
        shown["attempts"] = node["attempts"] or len(node["tries"])
        if (state in COMPLETED_RESULT_TYPES or state in _ANSWERED) and finished is not None:
            shown["output"] = (
                finished["output"] if "output" in finished else steps.committed.get(node_id)
            )
        if finished is not None and "error" in finished:
            shown["error"] = finished["error"]
        if node_id in in_flight:
            shown["idempotency_key"] = in_flight[node_id]
        if node_id in waiting:
            shown["correlation_key"] = waiting[node_id]
        nodes.append(shown)
    trace = {
        "job": job.to_dict(),
        "kind": "agent",
        "agent": steps.agent,
        "plan_hash": steps.agent.get("agent_hash"),
        "policy": steps.agent.get("policy"),
        "nodes": nodes,
        "waiting_for": [{"node_id": n, "correlation_key": k} for n, k in waiting.items()]
        if job.status == "waiting"
        else [],
        "parked": steps.parked,
        "warnings": steps.warnings,
        "created_at": _payload(events[0]).get("at") if events else None,
        "event_count": len(events),
        "input": _payload(events[0]).get("input") if events else None,
    }
    return trace, steps.outcome
