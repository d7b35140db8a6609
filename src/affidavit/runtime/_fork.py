"""Forking a job from a step: a new job whose first steps are the source's recorded ones.

The service function behind ``Runtime.fork``, ``affidavit jobs fork`` and
``POST /api/jobs/{id}/fork`` (docs/runtime.md, "Fork / re-run from a step").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from affidavit.core.agent_steps import agent_hash, agent_node_id
from affidavit.core.canonical import canonical, canonical_nested, canonical_sha256
from affidavit.core.errors import ForkRefused, IdempotencyConflict
from affidavit.core.events import utc_now
from affidavit.core.plan import Plan
from affidavit.record import ReplayContext, build_from_events
from affidavit.runtime._sdk import ToolRegistry
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
    tools: ToolRegistry | None = None,
    idempotency_key: str | None = None,
) -> JobRecord:
    """The fork :func:`submit_fork` makes (or finds by ``idempotency_key``); it raises what
    that raises."""
    return submit_fork(
        store,
        job_id,
        from_step,
        input,
        submitted_by=submitted_by,
        placement=placement,
        tools=tools,
        idempotency_key=idempotency_key,
    )[0]


def submit_fork(
    store: Store,
    job_id: str,
    from_step: str,
    input: Any = _SAME_INPUT,
    *,
    submitted_by: str | None = None,
    placement: Placement | None = None,
    tools: ToolRegistry | None = None,
    idempotency_key: str | None = None,
) -> tuple[JobRecord, bool]:
    """``(job, created)``: a job that reuses the sealed job ``job_id``'s recorded steps up to
    and including ``from_step`` (a plan node id, an agent step's ``#SEQ`` or a step id) and
    runs the rest; ``input`` (when given) replaces the source's input for the steps that run.
    The new job's ``job_created`` names the source, the hash of its seal, the step and each
    reused step's recorded output. An agent fork runs the version of the source's agent
    registered in ``tools`` (the code deployed now; without one there, the source's version).

    ``idempotency_key`` (in the source's namespace): the same key returns the fork it made
    before, for the same source, step and input.

    Raises:
        JobNotFound: no job ``job_id``.
        ForkRefused: the source has no seal or a subject, or ``from_step`` is none of the
            steps it completed; nothing is written.
        IdempotencyConflict: ``idempotency_key`` names a job that is not this fork (another
            source, step or input, or no fork); nothing is written.
        ConfigError: an idempotency key that is not non-empty text.
    """
    from affidavit.runtime._submit import check_idempotency_key

    check_idempotency_key(idempotency_key)
    source = store.get_job(job_id)
    if store.job_key(job_id) is not None:  # its recorded values are sealed for it alone
        raise ForkRefused(
            f"job {job_id} has a subject: a fork would need its values outside the subject's "
            "key (not supported)"
        )
    seal = store.get_seal(job_id)
    if seal is None:
        raise ForkRefused(f"job {job_id} is {source.status}, not finished: it has no seal to fork")
    replay = build_from_events(store.list_events(job_id))
    if replay.agent is not None:
        deployed = tools.get_agent(str(replay.agent["agent"])) if tools is not None else None
        version = deployed.version if deployed is not None else None
        node_id, reused, second = _agent_prefix(replay, job_id, from_step, version)
    else:
        node_id, reused, second = _plan_prefix(replay, job_id, from_step)
    job_input = replay.input if input is _SAME_INPUT else input
    canonical_nested(job_input)
    forked_from = {
        "job_id": job_id,
        "seal_hash": canonical_sha256(seal.to_dict()),
        "step": node_id,
        "reused": reused,
    }
    at = utc_now()
    namespace = replay.namespace or source.namespace
    job, created = store.create_job(
        namespace=namespace,
        plan_name=source.plan_name,
        idempotency_key=idempotency_key,
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
                    "idempotency_key": idempotency_key,
                    "forked_from": forked_from,
                }
                | ({"kind": "agent"} if replay.agent is not None else {}),
            ),
            NewEvent(second[0], {"at": at, **second[1]}),
        ],
    )
    if not created:
        _same_fork(store, job, forked_from, job_input)
    return job, created


def _same_fork(store: Store, job: JobRecord, forked_from: dict[str, Any], job_input: Any) -> None:
    """A key already used names the same fork only for the same source, step and input.

    Raises:
        IdempotencyConflict: the key's job is another fork, or no fork.
    """
    first = store.list_events(job.job_id, limit=1)
    created = first[0].payload if first and first[0].type == "job_created" else {}
    recorded = created.get("forked_from")
    recorded = recorded if isinstance(recorded, dict) else {}
    differs = [
        what
        for what, same in (
            ("source job", recorded.get("job_id") == forked_from["job_id"]),
            ("step", recorded.get("step") == forked_from["step"]),
            ("input", canonical(created.get("input")) == canonical(job_input)),
        )
        if not same
    ]
    if differs:
        raise IdempotencyConflict(
            f"idempotency key {job.idempotency_key!r} names job {job.job_id}, "
            + ("not a fork" if not recorded else f"forked with another {' and '.join(differs)}")
        )


Prefix = tuple[str, list[dict[str, Any]], tuple[str, dict[str, Any]]]


def _plan_prefix(replay: ReplayContext, job_id: str, from_step: str) -> Prefix:
    """The node the prefix ends with, the reused steps and the ``plan_generated`` of a fork
    of a plan job."""
    assert replay.task_graph is not None
    plan = Plan.of_recorded_graph(replay.task_graph, replay.plan_hash)
    node_id = _node_of(replay.step_ids, from_step)
    if node_id is None:
        raise ForkRefused(f"job {job_id} has no step {from_step!r}")
    prefix = plan.order[: plan.order.index(node_id) + 1]
    _check_completed(replay, job_id, prefix)
    reused = [
        {"node_id": n, "step_id": replay.step_ids[n], "output": replay.node_output(n)}
        for n in prefix
    ]
    generated = {
        "task_graph": dict(replay.task_graph),
        "plan_hash": plan.plan_hash,
        "policy": replay.policy,
    }
    return node_id, reused, ("plan_generated", generated)


def _agent_prefix(
    replay: ReplayContext, job_id: str, from_step: str, version: str | None
) -> Prefix:
    """As :func:`_plan_prefix`, for an agent job: its calls ``#0`` to ``#SEQ``, each with its
    ``step_called`` (kind, tool, args), and the ``agent_started`` of the version to run."""
    assert replay.agent is not None
    node_id = _node_of(replay.step_ids, from_step)
    if node_id is None:
        raise ForkRefused(f"job {job_id} has no step {from_step!r}")
    last = int(node_id[1:])
    prefix = [agent_node_id(seq) for seq in range(last + 1)]
    _check_completed(replay, job_id, prefix)
    reused = []
    for seq in range(last + 1):
        called = replay.agent_steps[seq]
        reused.append(
            {
                "node_id": called["node_id"],
                "step_id": called["step_id"],
                "output": replay.node_output(called["node_id"]),
                "seq": seq,
                "kind": called["kind"],
                "tool_name": called.get("tool_name"),
                "args": called.get("args"),
                "args_hash": called.get("args_hash"),
            }
        )
    started = {k: v for k, v in replay.agent.items() if k != "at"}
    if version is not None:
        started["agent_version"] = version
        started["agent_hash"] = agent_hash(str(started["agent"]), version)
    return node_id, reused, ("agent_started", started)


def _check_completed(replay: ReplayContext, job_id: str, prefix: Sequence[str]) -> None:
    undone = [n for n in prefix if n not in replay.completed_nodes]
    if undone:
        raise ForkRefused(f"job {job_id} did not complete step {undone[0]!r}: it cannot be reused")


def _node_of(step_ids: dict[str, str], step: str) -> str | None:
    """The node ``step`` names: a node id (an agent's ``#SEQ``), or a node's step id."""
    if step in step_ids:
        return step
    return next((n for n, s in step_ids.items() if s == step), None)
