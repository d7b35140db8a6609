"""A job's trace: each node of its plan with what happened to it, read from the log.

The service function behind ``affidavit jobs trace``, ``GET /api/jobs/{id}/trace`` and the
trace page. Read-only.

A node's ``state`` is what the trace page colours it by:

- ``pure`` / ``side_effect_committed`` / ``compensated``: finished with that outcome;
  ``approved`` / ``signalled``: an approval or wait node a person answered (its outcome `pure`);
  ``denied``: an approval a person denied (its outcome `permanent_failure`, `not_approved`);
- ``unknown``: its tool call was closed with the outcome ``unknown`` (it may or may not have
  acted: a forced cancel, a job failed with the call in flight);
- ``in_flight``: a tool invocation started and never finished, and no live run holds it (a crash
  between T1 and T2); ``running``: started and not finished in a running job — a tool call
  included, while the run that made it holds the job's lease;
- ``waiting``: a wait or approval node the job waits on; ``parked``: the node the job is parked
  on (an in-flight invocation, a committed step the world no longer matches, the step a crash
  loop keeps dying in — not a completed node when the loop is in finishing the job);
- ``failed``: its last try failed;
- ``pending``: not started yet, or to be finished at the next pickup (a signalled wait);
  ``skipped``: never started and the job has ended.

:data:`~affidavit.record._states.NODE_STATE_KINDS` names them all, with what each says of a node
once its job ended; :func:`~affidavit.record._states.node_state` picks a node's state, for the plan
and the agent trace alike.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from affidavit.record._agent_trace import agent_trace_of, is_agent_log
from affidavit.record._job_doc import fork_lineage
from affidavit.record._opened import SubjectView
from affidavit.record._recovered import read_attempts
from affidavit.record._replay import ReplayContext, ReplayContextBuilder
from affidavit.record._states import (
    ANSWERED_STATES,
    NodeFacts,
    is_denial,
    lease_live,
    node_state,
)
from affidavit.store import JobFilter, JobRecord, Store, StoredEvent
from affidavit.store.limit_waits import waiting_for_limit


def job_trace(store: Store, job_id: str) -> dict[str, Any]:
    """The job, its nodes in plan order with state, outcome, attempts, timings, and the waits,
    park and confirmation warnings in force; ``waiting_for_limit`` while a call of the running
    job waits for a limit's grant (``{"limit", "since", "reason"}``). An agent job's nodes
    are its steps in sequence order (``"kind": "agent"``;
    :func:`~affidavit.record._agent_trace.agent_trace_of`).

    Raises:
        JobNotFound: no such job.
        ReplayError: the log is structurally impossible (see ``affidavit verify``).
    """
    view = SubjectView(store, job_id)  # a subject's values: opened, or shown erased
    job = view.job(store.get_job(job_id))
    events = view.events(store.list_events(job_id))
    # an agent job's trace is the sequence of its calls: see affidavit.record._agent_trace
    now = time.time()  # (a running job's lease tells a live run's call from a dead one's)
    if is_agent_log(events):
        trace = agent_trace_of(job, events, now=now)[0]
    else:
        trace = trace_of(job, events, now=now)[0]
    lineage = fork_lineage(events)
    if lineage is not None:
        trace["forked_from"] = lineage
    trace.update(job_family(store, job_id))
    if job.status == "running":  # a call waiting for a limit: not in the log (store-side)
        wait = waiting_for_limit(store, job_id, now_s=time.time())
        if wait is not None:
            trace["waiting_for_limit"] = wait
    return trace


#: The most child jobs a trace lists (``jobs list --parent`` pages through all).
MAX_TRACED_CHILDREN = 1000


def job_family(store: Store, job_id: str) -> dict[str, Any]:
    """The job's place in its tree as the trace shows it: ``parent_job_id`` (``None`` for a
    job no job created) and ``children``, each ``{"job_id", "status"}``, oldest first, at most
    :data:`MAX_TRACED_CHILDREN`."""
    listed = store.list_jobs(JobFilter(parent=job_id, limit=MAX_TRACED_CHILDREN))
    return {
        "parent_job_id": store.job_parent(job_id),
        "children": [{"job_id": j.job_id, "status": j.status} for j in reversed(listed)],
    }


def park_doc(replay: ReplayContext) -> dict[str, Any] | None:
    """The park in force as operators see it (``jobs show``, the trace): the ``job_parked``
    payload without its time, and ``version``, the event's version — the park's identity, which
    ``resume`` may pin (``park_version``). ``None`` when the job is not parked."""
    if replay.parked is None or replay.parked_version is None:
        return None
    shown = {k: v for k, v in replay.parked.items() if k not in ("at", "version")}
    return {"version": replay.parked_version, **shown}


def trace_of(
    job: JobRecord, events: Sequence[StoredEvent], *, now: float | None = None
) -> tuple[dict[str, Any], ReplayContext]:
    """The trace of ``job`` from its log ``events`` (all of them, in version order), and the
    replay context built on the way (for callers that need both from one pass). ``now`` (Unix
    time) tells a call the running job's live run has open (``running``) from one a dead
    attempt left (``in_flight``); without it, every open call is ``in_flight``.

    Raises:
        ReplayError: the log is structurally impossible.
    """
    replay, timings = _read(events)
    started_at, finished_at = timings.started_at, timings.finished_at
    durations, tries = timings.durations, timings.tries
    sets = _Sets.of(replay)
    attempts = read_attempts(events)
    live = lease_live(job, now)
    pending_nodes, open_waits, completed = sets.pending_nodes, sets.open_waits, sets.completed
    graph = replay.task_graph or {"nodes": []}
    nodes = []
    for raw in graph["nodes"]:
        node_id = raw["id"]
        finished = replay.node_finished.get(node_id)
        outcome = finished["result_type"] if finished else None
        facts = NodeFacts(
            outcome=outcome,
            completed=node_id in completed,
            finished=finished is not None,
            started=node_id in started_at,
            in_flight=node_id in pending_nodes,
            waiting=node_id in open_waits,
            unknown=node_id in sets.unknown,
            signalled=node_id in sets.signalled,
            parked_on=sets.decided_node == node_id,
            answered=sets.answered.get(node_id),
            denied=raw["type"] == "approval" and is_denial(finished),
            call_live=live and attempts.last_worker(node_id) == job.lease_owner,
        )
        state = node_state(facts, job)
        node: dict[str, Any] = {
            "id": node_id,
            "type": raw["type"],
            "tool": raw.get("tool"),
            "depends_on": list(raw.get("depends_on", [])),
            "step_id": replay.step_ids.get(node_id),
            "state": state,
            "outcome": outcome,
            "attempts": replay.node_attempts.get(node_id, len(tries.get(node_id, []))),
            "started_at": started_at.get(node_id),
            "finished_at": finished_at.get(node_id),
            "duration_ms": durations.get(node_id),
            "tries": [
                {**t, "worker_id": attempts.worker_of(node_id, t["attempt"])}
                for t in tries.get(node_id, [])
            ],
            "recovered": attempts.recovered.get(node_id, []),
        }
        if node_id in completed:
            node["output"] = replay.node_output(node_id)
        if finished is not None and "error" in finished:
            node["error"] = finished["error"]
        if node_id in pending_nodes:
            node["idempotency_key"] = pending_nodes[node_id]
        if node_id in open_waits:
            node["correlation_key"] = open_waits[node_id]
        nodes.append(node)
    trace = {
        "job": job.to_dict(),
        "plan_hash": replay.plan_hash,
        "policy": replay.policy,
        "nodes": nodes,
        "waiting_for": [
            {"node_id": n, "wait_type": replay.waits[k]["wait_type"], "correlation_key": k}
            for n, k in open_waits.items()
        ]
        if job.status == "waiting"
        else [],
        "parked": park_doc(replay),
        "warnings": replay.warnings,
        "created_at": events[0].payload.get("at") if events else None,
        "event_count": len(events),
        "input": job_input(events),
    }
    return trace, replay


def job_input(events: Sequence[StoredEvent]) -> Any:
    """The job's input as its ``job_created`` recorded it (``None`` without one)."""
    first = events[0].payload if events and events[0].type == "job_created" else None
    return first.get("input") if isinstance(first, dict) else None


@dataclass(slots=True)
class _Timings:
    """When each node first started and last finished, its summed duration and its tries."""

    started_at: dict[str, str] = field(default_factory=dict)
    finished_at: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    tries: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _read(events: Sequence[StoredEvent]) -> tuple[ReplayContext, _Timings]:
    """One pass over the log: the replay context, and the nodes' timings.

    Raises:
        ReplayError: the log is structurally impossible.
    """
    builder = ReplayContextBuilder()
    timings = _Timings()
    for e in events:
        p = e.payload  # (UnreadableEventError: not JSON)
        builder.add(e, p)
        if e.type not in ("node_started", "node_finished"):
            continue
        node_id = p["node_id"]
        if e.type == "node_started":
            timings.started_at.setdefault(node_id, p.get("at", ""))
        else:
            timings.finished_at[node_id] = p.get("at", "")
            durations = timings.durations
            durations[node_id] = durations.get(node_id, 0) + float(p.get("duration_ms", 0))
            timings.tries.setdefault(node_id, []).append(
                {
                    "attempt": p.get("attempt"),
                    "result_type": p["result_type"],
                    "at": p.get("at"),
                    "duration_ms": p.get("duration_ms"),
                    "error": p.get("error"),
                    "version": e.version,
                }
            )
    return builder.ctx, timings


@dataclass(frozen=True, slots=True)
class _Sets:
    """What the replay context says of the plan's nodes, as the state ladder asks it."""

    pending_nodes: dict[str, str]  # node id -> the idempotency key of its open invocation
    open_waits: dict[str, str]  # node id -> the correlation key of its unanswered wait
    completed: set[str]  # the completed node ids
    decided_node: str | None  # the node a person must decide about (the parked job's)
    signalled: set[str]  # nodes whose wait was answered
    answered: dict[str, str]  # node id -> its state once a person answered its wait
    unknown: set[str]  # tool nodes whose last invocation was closed as `unknown`

    @classmethod
    def of(cls, replay: ReplayContext) -> _Sets:
        parked_node = replay.parked.get("node_id") if replay.parked else None
        # a crash loop names the node the next run starts with; when that node completed, the
        # runs died finishing the job: nothing is to be decided about the node itself
        loop_after_steps = (
            replay.parked is not None
            and replay.parked.get("reason") == "crash_loop"
            and parked_node in replay.completed_nodes
        )
        return cls(
            pending_nodes={p["node_id"]: k for k, p in replay.pending_tool_invocations.items()},
            open_waits={
                w["node_id"]: k for k, w in replay.waits.items() if k not in replay.completed_waits
            },
            completed=replay.completed_nodes,
            decided_node=None if loop_after_steps else parked_node,
            signalled={w["node_id"] for w in replay.completed_waits.values()},
            answered={
                w["node_id"]: ANSWERED_STATES[w["wait_type"]]
                for k, w in replay.waits.items()
                if k in replay.completed_waits and w.get("wait_type") in ANSWERED_STATES
            },
            unknown={
                inv.node_id
                for inv in replay.invocations.values()
                if not inv.committed and inv.finished and inv.finished[-1]["outcome"] == "unknown"
            },
        )
