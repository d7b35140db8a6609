"""A fork's reused prefix checked against its source's record (docs/verification.md, "Forks").

The log proofs check a fork as a log (:mod:`affidavit.verify._fold_plan` folds the reused nodes
in as completed); this checks what they cannot see from the fork alone: that the source named
by ``job_created``'s ``forked_from`` is sealed with the seal recorded (its hash), and that each
copied result is the one the source recorded for that step. Without the source in the store
the prefix is *unverified by reference* — never passed silently.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from affidavit.core.agent_steps import agent_step_id
from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.core.errors import AffidavitError, JobNotFound
from affidavit.core.plan import Plan
from affidavit.store import Store, StoredEvent


@dataclass(frozen=True, slots=True)
class ForkCheck:
    """``status``: ``verified`` (the source holds the copied results under the recorded
    seal), ``unverified`` (the source is not in this store) or ``failed`` (``problem`` says
    why)."""

    job_id: str
    source_job_id: str
    step: str
    status: str
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "source_job_id": self.source_job_id,
            "step": self.step,
            "status": self.status,
        }
        if self.problem is not None:
            doc["problem"] = self.problem
        return doc


def check_fork(store: Store, job_id: str) -> ForkCheck | None:
    """The reference check of fork ``job_id`` (``None``: the job is no fork)."""
    first = store.list_events(job_id, limit=1)
    forked = (
        first[0].payload.get("forked_from") if first and first[0].type == "job_created" else None
    )
    if not isinstance(forked, dict):
        return None
    source, step = str(forked.get("job_id")), str(forked.get("step"))
    try:
        store.get_job(source)
    except JobNotFound:
        return ForkCheck(job_id, source, step, "unverified")
    seal = store.get_seal(source)
    if seal is None:
        return ForkCheck(job_id, source, step, "failed", f"the source job {source} has no seal")
    try:
        problem = check_reuse(forked, store.list_events(source), canonical_sha256(seal.to_dict()))
    except (AffidavitError, KeyError, TypeError, AttributeError) as exc:  # a broken source log
        problem = f"the source's log cannot be read: {type(exc).__name__} {exc}"
    return ForkCheck(job_id, source, step, "failed" if problem else "verified", problem)


def check_reuse(
    forked: dict[str, Any], source_events: Iterable[StoredEvent], seal_hash: str
) -> str | None:
    """What is wrong with ``forked`` (a ``forked_from`` payload) against the source's log and
    the hash of its current seal; ``None`` when nothing is."""
    if forked.get("seal_hash") != seal_hash:
        return "the recorded seal hash is not the hash of the source's seal"
    recorded = _recorded_results(source_events)
    for step in forked.get("reused") or ():
        node_id = step.get("node_id") if isinstance(step, dict) else None
        found = recorded.get(node_id) if isinstance(node_id, str) else None
        if found is None:
            return f"the source did not complete the reused step {node_id!r}"
        step_id, output = found
        if step.get("step_id") != step_id:
            return f"the reused step {node_id!r} has not the source's step id"
        try:
            same = canonical(step.get("output")) == canonical(output)
        except AffidavitError:
            same = False
        if not same:
            return f"the copied result of step {node_id!r} is not the one the source recorded"
    return None


def _recorded_results(events: Iterable[StoredEvent]) -> dict[str, tuple[str, Any]]:
    """Node id → (step id, recorded output) of every node the source log completed: a pure,
    wait or approval node's ``node_finished`` output, a tool node's committed result (read
    from the log here, independently of the runtime's replay); a source that is a fork itself
    adds the steps it reused, under its own step ids."""
    committed: dict[str, Any] = {}  # node id -> committed result
    finished: dict[str, Any] = {}  # invocation id -> result of a successful finish
    out: dict[str, tuple[str, Any]] = {}
    reused: list[Any] = []
    for event in events:
        p = event.payload
        if event.type == "job_created" and isinstance(p.get("forked_from"), dict):
            reused = list(p["forked_from"].get("reused") or ())
        elif event.type in ("plan_generated", "agent_started") and reused:
            out.update(_own_reused(event.job_id, event.type, p, reused))
        elif event.type == "tool_invocation_finished" and p.get("outcome") == "success":
            finished[p["invocation_id"]] = p.get("result")
        elif event.type == "command_committed":
            committed[p["node_id"]] = finished.get(p["command_id"])
        elif event.type == "node_finished" and p.get("result_type") in _PASSED:
            node_id = p["node_id"]
            out[node_id] = (p["step_id"], p["output"] if "output" in p else committed.get(node_id))
    return out


_PASSED = ("pure", "side_effect_committed")


def _own_reused(
    job_id: str, event_type: str, p: dict[str, Any], reused: list[Any]
) -> dict[str, tuple[str, Any]]:
    """The steps a fork reused, under the fork's own step ids (docs/formats.md "Forks")."""
    if event_type == "agent_started":
        return {
            r["node_id"]: (agent_step_id(job_id, r["seq"], r["kind"]), r.get("output"))
            for r in reused
        }
    steps = Plan.of_recorded_graph(p["task_graph"], p.get("plan_hash")).step_ids(job_id)
    return {r["node_id"]: (steps[r["node_id"]], r.get("output")) for r in reused}
