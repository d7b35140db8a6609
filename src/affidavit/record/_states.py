"""The states a node of a trace can be in, and the one ladder that picks a node's state from
what the log says of it — shared by the plan trace (:mod:`affidavit.record._trace`) and the
agent trace (:mod:`affidavit.record._agent_trace`), which differ only in how they read the
facts from their logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from affidavit.core.approvals import NOT_APPROVED
from affidavit.store import JobRecord

# Every state a node of a trace (a plan's or an agent job's) can be in, and what it says of
# the node for readers that need less than the state — the proof pack (docs/packs.md) maps each
# kind to a step status, so a state added here must say what it means there:
# "completed": finished, its output recorded; "undone": its call failed and its compensation
# ran; "failed": its last try failed (or it started and the job ended first); "open": the job
# is not done with it (only while the job is unfinished); "not_run": never started, and the
# job has ended.
NODE_STATE_KINDS: dict[str, str] = {
    "pure": "completed",
    "side_effect_committed": "completed",
    "compensated": "undone",
    "in_flight": "open",
    "waiting": "open",
    "approved": "completed",
    "denied": "failed",  # (an approval a person denied: the job fails with `not_approved`)
    "signalled": "completed",
    "parked": "open",
    "running": "open",
    "failed": "failed",
    "unknown": "failed",  # (its call may or may not have acted: no output to show as a result)
    "pending": "open",
    "skipped": "not_run",
}
NODE_STATES = tuple(NODE_STATE_KINDS)
# The state of a finished wait or approval node a person answered, by its wait type (its
# outcome, the world semantics of the step, is `pure`, which on its own reads as a computation).
ANSWERED_STATES = {"signal": "signalled", "approval": "approved"}
NODE_STATE_KIND_NAMES = ("completed", "undone", "failed", "open", "not_run")
COMPLETED_STATES = frozenset(s for s, kind in NODE_STATE_KINDS.items() if kind == "completed")


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a trace read of one node from the log, as the ladder needs it."""

    outcome: str | None  # the result type of its latest node_finished (None: none yet)
    completed: bool  # finished with a completed result type
    finished: bool  # a node_finished was recorded (of any result type)
    started: bool  # a node_started was recorded
    in_flight: bool  # a tool invocation of it is open
    waiting: bool  # a wait of it is not answered
    unknown: bool  # its last invocation was closed with the outcome `unknown`
    signalled: bool  # a wait of it was answered
    parked_on: bool  # the parked job is parked on it (a decision about it is outstanding)
    answered: str | None = None  # its state once a person answered it (approved, signalled)
    denied: bool = False  # an approval a person denied (its node failed `not_approved`)
    call_live: bool = False  # its open call belongs to the run holding the job's live lease


def lease_live(job: JobRecord, now: float | None) -> bool:
    """Whether ``job`` is running under a lease that has not expired at ``now`` (Unix time;
    ``None``: no clock to tell, read as expired) — a run that holds it is alive, so a call it
    has open is running, not left in flight by a dead one."""
    expires = job.lease_expires_at
    return job.status == "running" and now is not None and expires is not None and expires > now


def is_denial(finished: dict[str, Any] | None) -> bool:
    """Whether the ``node_finished`` payload ``finished`` ends an approval a person denied."""
    error = finished.get("error") if finished else None
    return isinstance(error, dict) and error.get("type") == NOT_APPROVED["type"]


def node_state(facts: NodeFacts, job: JobRecord) -> str:
    """The state of the node ``facts`` describe in ``job``: the first rung that holds."""
    if facts.parked_on and job.status == "parked":
        state = "parked"  # the step a person must decide about, whatever it did before
    elif facts.answered is not None and facts.outcome == "pure":
        state = facts.answered  # (its world outcome stays `pure`: no side effect)
    elif facts.denied and facts.finished:
        state = "denied"  # (its outcome: permanent_failure, `not_approved`)
    elif facts.completed:
        state = str(facts.outcome)
    elif facts.in_flight:
        # a live run's call is running; one no live run holds was left by a dead attempt
        state = "running" if facts.call_live else "in_flight"
    elif facts.waiting and job.status == "waiting":
        state = "waiting"
    elif facts.unknown:
        state = "unknown"  # its call may or may not have acted (a forced cancel, say)
    elif facts.finished:
        state = "failed"
    elif job.terminal:
        state = "failed" if facts.started else "skipped"
    elif facts.started and job.status == "running" and not facts.signalled:
        state = "running"
    else:
        state = "pending"
    return state
