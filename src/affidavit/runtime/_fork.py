"""Forking a job from a step: a new job whose first steps are the source's recorded ones.

The service function behind ``Runtime.fork``, ``affidavit jobs fork`` and
``POST /api/jobs/{id}/fork`` (docs/runtime.md, "Fork / re-run from a step").
"""

from __future__ import annotations

from typing import Any

from affidavit.core.canonical import canonical_nested, canonical_sha256
from affidavit.core.errors import ForkRefused
from affidavit.core.events import utc_now
from affidavit.core.plan import Plan
from affidavit.record import build_from_events
from affidavit.store import JobRecord, NewEvent, Store
from affidavit.store.queues import Placement

_SAME_INPUT: Any = object()


def fork_job(
    store: Store,
    job_id: str,
    from_step: str,
    input: Any = _SAME_INPUT,
    *,
    submitted_by: str | None = None,
    placement: Placement | None = None,
) -> JobRecord:
    """Create a job that reuses the sealed job ``job_id``'s recorded steps up to and including
    ``from_step`` (a plan node id or a step id) and runs the rest; ``input`` (when given)
    replaces the source's input for the steps that run. The new job's ``job_created`` names
    the source, the hash of its seal, the step and each reused step's recorded output.

    Raises:
        JobNotFound: no job ``job_id``.
        ForkRefused: the source has no seal, is an agent job, or ``from_step`` is none of the
            steps it completed; nothing is written.
    """
    source = store.get_job(job_id)
    seal = store.get_seal(job_id)
    if seal is None:
        raise ForkRefused(f"job {job_id} is {source.status}, not finished: it has no seal to fork")
    replay = build_from_events(store.list_events(job_id))
    if replay.kind == "agent" or replay.task_graph is None:
        raise ForkRefused(f"job {job_id} is an agent job: only plan jobs can be forked yet")
    plan = Plan.of_recorded_graph(replay.task_graph, replay.plan_hash)
    node_id = _node_of(plan, replay.step_ids, from_step)
    if node_id is None:
        raise ForkRefused(f"job {job_id} has no step {from_step!r}")
    prefix = plan.order[: plan.order.index(node_id) + 1]
    done = replay.completed_nodes
    undone = [n for n in prefix if n not in done]
    if undone:
        raise ForkRefused(f"job {job_id} did not complete step {undone[0]!r}: it cannot be reused")
    job_input = replay.input if input is _SAME_INPUT else input
    canonical_nested(job_input)
    forked_from = {
        "job_id": job_id,
        "seal_hash": canonical_sha256(seal.to_dict()),
        "step": node_id,
        "reused": [
            {"node_id": n, "step_id": replay.step_ids[n], "output": replay.node_output(n)}
            for n in prefix
        ],
    }
    at = utc_now()
    namespace = replay.namespace or source.namespace
    job, _ = store.create_job(
        namespace=namespace,
        plan_name=source.plan_name,
        idempotency_key=None,
        submitted_by=submitted_by,
        placement=placement,
        events=[
            NewEvent(
                "job_created",
                {
                    "at": at,
                    "input": job_input,
                    "plan_name": source.plan_name,
                    "namespace": namespace,
                    "submitted_by": submitted_by,
                    "idempotency_key": None,
                    "forked_from": forked_from,
                },
            ),
            NewEvent(
                "plan_generated",
                {
                    "at": at,
                    "task_graph": dict(replay.task_graph),
                    "plan_hash": plan.plan_hash,
                    "policy": replay.policy,
                },
            ),
        ],
    )
    return job


def _node_of(plan: Plan, step_ids: dict[str, str], step: str) -> str | None:
    """The node ``step`` names: a node id, or a node's step id."""
    if step in plan.by_id:
        return step
    return next((n for n, s in step_ids.items() if s == step), None)
