"""What the (verified) event log says each step's recorded trace must be — the other half of
the exporter's mapping (:mod:`affidavit.packs._export_steps`), read from the events alone.

Only the fields named here are read: decision events (``wait_completed``, ``job_resumed``,
``job_cancelled``, ...) may carry any further fields (who decided, a note) without changing a
trace. Invocation outcomes are mapped by :data:`INVOCATION_OUTCOMES`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.events import COMPLETED_RESULT_TYPES
from affidavit.core.plan import Plan
from affidavit.packs import _format as F

# What a recorded invocation outcome gives the step's trace: ``True`` — its result, which a
# committed tool step records as its output; ``False`` — nothing: the step's trace is then its
# node's failure, or ``{"outcome": null, "error": null}`` when the job ended before the node
# finished. ``lost`` and ``unknown`` (the call's effect is in doubt) record no result: a pack
# never presents an effect in doubt as a result. An outcome not named here records none either
# (the log's verification, which runs first, refuses outcomes it does not know).
INVOCATION_OUTCOMES: dict[str, bool] = {
    "success": True,
    "failure": False,
    "timeout": False,
    "lost": False,
    "unknown": False,
}


@dataclass
class _Read:
    job_input: Any = None
    status: str = "pending"
    output: Any = None
    error: Any = None
    step_of: dict[str, str] = field(default_factory=dict)
    called: dict[str, tuple[int, str]] = field(default_factory=dict)  # node -> (seq, step id)
    finished: dict[str, dict[str, Any]] = field(default_factory=dict)
    succeeded: dict[str, Any] = field(default_factory=dict)  # idempotency key -> result
    committed: dict[str, Any] = field(default_factory=dict)  # node -> its committed result
    job_id: str | None = None
    forked: Any = None  # job_created's forked_from: a fork's reused steps

    def add(self, kind: str, p: Any) -> None:
        if kind == "node_started":
            self.step_of[p["node_id"]] = p["step_id"]
        elif kind == "node_finished":
            self.step_of[p["node_id"]] = p["step_id"]
            self.finished[p["node_id"]] = p
        elif kind == "tool_invocation_finished":
            outcome = p.get("outcome")
            if isinstance(outcome, str) and INVOCATION_OUTCOMES.get(outcome, False):
                self.succeeded[p["idempotency_key"]] = p.get("result")
        elif kind == "command_committed":
            self.committed.setdefault(p["node_id"], self.succeeded.get(p["idempotency_key"]))
        elif kind == "step_called":
            self.called[p["node_id"]] = (p["seq"], p["step_id"])
        elif kind == "job_created":
            self.job_input = p.get("input")
            self.forked = p.get("forked_from")
        elif kind == "plan_generated" and isinstance(self.forked, dict) and self.job_id:
            self._reused(Plan.of_recorded_graph(p["task_graph"], p.get("plan_hash")))
        elif kind == "job_completed":
            self.status, self.output = "completed", p.get("output")
        elif kind == "job_failed":
            self.status, self.error = "failed", p.get("error")
        elif kind == "job_cancelled":
            self.status = "cancelled"

    def _reused(self, plan: Plan) -> None:
        """A plan fork's reused nodes (docs/formats.md "Forks"): steps that passed with the
        source's recorded outputs, under this job's step ids. (An agent fork's reused calls
        have no step_called here: the pack has no step for them.)"""
        steps = plan.step_ids(str(self.job_id))
        for step in self.forked["reused"]:
            node_id = step["node_id"]
            if "seq" in step or node_id not in steps:
                continue
            self.step_of[node_id] = steps[node_id]
            self.finished[node_id] = {"result_type": "pure", "output": step.get("output")}


# The result types of a node that make it a PASS step: it finished with its output. A
# `compensated` node (its call failed, its compensation ran) is a FAIL step.
PASSING_RESULT_TYPES = COMPLETED_RESULT_TYPES - {"compensated"}


@dataclass(frozen=True, slots=True)
class LogTraces:
    """The job's input, and the trace of each step the log names (``by_step``); a step the
    log does not name did not run (``not_run``)."""

    job_input: Any
    by_step: dict[str, Any]
    not_run: dict[str, Any]
    passing: frozenset[str]  # the node steps the log has pass
    # step id -> (the trace an exporter that mislabelled the step recorded, what it did): see
    # mislabelled
    mislabels: dict[str, tuple[Any, str]]

    def of(self, step_id: str) -> Any:
        return self.by_step.get(step_id, self.not_run)

    def passed(self, step_id: str) -> bool:
        """Whether the log has step ``step_id`` pass: the input loaded, a completed job's
        output, a node that completed (not one compensated)."""
        if step_id == F.LOAD_STEP_ID:
            return True
        if step_id == F.EMIT_STEP_ID:
            return bool(self.not_run["job_status"] == "completed")
        return step_id in self.passing

    def mislabelled(self, step_id: str) -> tuple[Any, str] | None:
        """What an exporter that mislabelled this step recorded as its trace, and what it did
        wrong; ``None`` when no exporter did. affidavit exported approval and wait nodes a
        person answered as failed, ``{"outcome": "pure", "error": null}``, before their trace
        states were mapped, and compensated nodes as passed, with their output (docs/packs.md).
        """
        return self.mislabels.get(step_id)


def log_traces(log: Iterable[tuple[str, Any]], job_id: str | None = None) -> LogTraces:
    """The traces ``log`` (``(type, parsed payload)`` per event, in order) of job ``job_id``
    implies (the job id derives a plan fork's step ids).

    Raises:
        KeyError, TypeError, AttributeError: an event lacks a field these need.
    """
    read = _Read(job_id=job_id)
    for kind, p in log:
        read.add(kind, p)
    expected: dict[str, Any] = {
        F.LOAD_STEP_ID: read.job_input,
        F.EMIT_STEP_ID: {"claim_type": "job_output", "output": read.output}
        if read.status == "completed"
        else {"claim_type": "job_output", "status": read.status, "error": read.error},
    }
    step_of = dict(read.step_of)
    for node_id, (seq, sid) in read.called.items():  # an agent step is named by its seq too
        if node_id in step_of and type(seq) is int and isinstance(sid, str):
            step_of[node_id] = F.agent_pack_step_id(seq, sid, len(read.called))
    passing: set[str] = set()
    mislabels: dict[str, tuple[Any, str]] = {}
    for node_id, sid in step_of.items():
        done = read.finished.get(node_id)
        if done is None:  # started, never finished
            expected[sid] = {"outcome": None, "error": None}
            continue
        result_type, error = done.get("result_type"), done.get("error")
        failure = {"outcome": result_type, "error": error}
        output = None
        if result_type in COMPLETED_RESULT_TYPES:
            output = done["output"] if "output" in done else read.committed.get(node_id)
        if result_type in PASSING_RESULT_TYPES:
            expected[sid] = output
            passing.add(sid)
            mislabels[sid] = (failure, f"records a step that completed ({result_type}) as failed")
        else:
            expected[sid] = failure
            if result_type == "compensated":
                mislabels[sid] = (output, "records a compensated step as passed")
    not_run = {"outcome": "not_run", "job_status": read.status}
    return LogTraces(read.job_input, expected, not_run, frozenset(passing), mislabels)
