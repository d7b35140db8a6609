"""What the log says of each step's attempts beyond their outcomes: the worker that ran each
attempt, and the calls a later attempt recovered after the attempt that made them died — shared
by the plan trace (:mod:`affidavit.record._trace`) and the agent trace
(:mod:`affidavit.record._agent_trace`), read from the events alone.

A call a dead attempt left open (``tool_invocation_started`` without its closing) is closed by
the attempt that finds it, with ``catch_up: true`` (docs/formats.md):

- ``caught_up``: the tool's reconcile hook found the effect; it is committed as the step's
  result and the tool is not called again;
- ``rerun``: the hook found nothing: the call is closed as ``lost`` and the step starts again
  (the next ``node_started``, with its worker);
- ``lost``: the hook found nothing and no new try followed (the job was asked to cancel).

A closing made while a park is in force is a person's decision (``affidavit resume``), not a
recovery, and a call closed as ``unknown`` (the ``in_flight: fail`` policy, a forced cancel)
recovered nothing: neither is listed. A closing that ends a call which timed out in a live
attempt carries ``resolution: "reconcile"`` and is listed with it (``after: "timeout"``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from affidavit.store import StoredEvent


@dataclass(slots=True)
class Attempts:
    """Per step (node id): the worker of each attempt, and its recovered calls in log order."""

    workers: dict[str, dict[int, str]] = field(default_factory=dict)  # node -> attempt -> worker
    recovered: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def worker_of(self, node_id: str, attempt: Any) -> str | None:
        """The worker that started ``attempt`` of ``node_id`` (``None``: not recorded)."""
        if type(attempt) is not int:
            return None
        return self.workers.get(node_id, {}).get(attempt)

    def last_worker(self, node_id: str) -> str | None:
        """The worker of the step's latest attempt (``None``: not recorded)."""
        by_attempt = self.workers.get(node_id)
        return by_attempt[max(by_attempt)] if by_attempt else None


def read_attempts(events: Iterable[StoredEvent]) -> Attempts:
    """The attempts' workers and the recovered calls of ``events`` (a job's log, in version
    order). A payload that is not an object is skipped: the trace's own reading reports it."""
    found = Attempts()
    started: dict[str, dict[str, Any]] = {}  # idempotency key -> its open start
    parked = False
    pending_rerun: dict[str, dict[str, Any]] = {}  # node -> its rerun entry, until it restarts
    for e in events:
        p = e.payload
        if not isinstance(p, dict):
            continue
        kind = e.type
        node_id = p.get("node_id")
        if kind == "job_parked":
            parked = True
        elif kind == "job_resumed":
            parked = False
        elif not isinstance(node_id, str):
            continue
        elif kind == "node_started":
            attempt, worker = p.get("attempt"), p.get("worker_id")
            if type(attempt) is int and isinstance(worker, str):
                found.workers.setdefault(node_id, {})[attempt] = worker
            rerun = pending_rerun.pop(node_id, None)
            if rerun is not None:
                rerun.update(how="rerun", rerun_attempt=attempt, rerun_worker_id=worker)
        elif kind == "tool_invocation_started":
            started[str(p.get("idempotency_key"))] = p
        elif kind == "tool_invocation_finished":
            opened = started.pop(str(p.get("idempotency_key")), None)
            if p.get("catch_up") is not True or parked or opened is None:
                continue
            outcome = p.get("outcome")
            if outcome not in ("success", "lost"):
                continue  # (`unknown`: nothing was recovered)
            attempt = opened.get("attempt")
            entry: dict[str, Any] = {
                "how": "caught_up" if outcome == "success" else "lost",
                "attempt": attempt,
                "worker_id": found.worker_of(node_id, attempt),
                "at": p.get("at"),
                "version": e.version,
            }
            if p.get("resolution") == "reconcile":
                entry["after"] = "timeout"
            found.recovered.setdefault(node_id, []).append(entry)
            if outcome == "lost":
                pending_rerun[node_id] = entry
    return found


def recovered_steps(events: Iterable[StoredEvent]) -> list[dict[str, Any]]:
    """Every recovered call of the log ``events``, in log order: ``{"node_id", "how",
    "attempt", "worker_id", "at", "version"}``, and ``rerun_attempt`` / ``rerun_worker_id`` for
    a re-run, ``after: "timeout"`` for a call that timed out in a live attempt (see the module
    docs) — what ``affidavit jobs show`` lists."""
    found = [
        {"node_id": node_id, **entry}
        for node_id, entries in read_attempts(events).recovered.items()
        for entry in entries
    ]
    return sorted(found, key=lambda entry: int(entry["version"]))


def recovery_text(entry: dict[str, Any]) -> str:
    """One line saying how the call ``entry`` (of :func:`recovered_steps`) was recovered."""
    attempt = f"attempt {entry.get('attempt')} (worker {entry.get('worker_id') or 'unrecorded'})"
    dead = "timed out" if entry.get("after") == "timeout" else "died with its call open"
    how = entry.get("how")
    if how == "caught_up":
        said = f"caught up: {attempt} {dead}; reconcile found the effect, committed (no new call)"
    elif how == "rerun":
        said = (
            f"re-run: {attempt} {dead}; reconcile found no effect (lost), attempt "
            f"{entry.get('rerun_attempt')} ran on worker {entry.get('rerun_worker_id')}"
        )
    else:
        said = f"lost: {attempt} {dead}; reconcile found no effect, and no new try followed"
    return f"{entry.get('node_id')}: {said}"
