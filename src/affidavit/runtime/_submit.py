"""Submitting a job: validate everything, then write ``job_created`` + ``plan_generated``.

The service function behind ``Runtime.submit``, ``affidavit submit|run`` and ``POST /api/jobs``.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from affidavit.core.agent_steps import agent_hash
from affidavit.core.canonical import canonical, canonical_nested
from affidavit.core.config import DEFAULT_NAMESPACE
from affidavit.core.errors import ConfigError, IdempotencyConflict, PlanError
from affidavit.core.events import TRACEPARENT, utc_now
from affidavit.core.plan import Plan
from affidavit.core.privacy import SubjectError, check_subject
from affidavit.core.tags import check_tags
from affidavit.record import check_input_references, opened_payload
from affidavit.runtime._agent import Agent
from affidavit.runtime._confirm import REPLAY_VERIFICATION_MODES
from affidavit.runtime._sdk import ToolRegistry
from affidavit.store import JobRecord, NewEvent, NewJob, Store, StoredEvent
from affidavit.store.queues import Placement


def missing_tools(plan: Plan, tools: ToolRegistry, done: Collection[str] = ()) -> list[str]:
    """The tools and pure functions the nodes of ``plan`` not in ``done`` need and ``tools``
    lacks (absent, or registered as the other kind), as ``"tool 'name'"``, sorted."""
    missing = set()
    for node in plan.nodes:
        if node.type not in ("tool", "pure") or node.id in done:
            continue
        found = tools.get(node.tool or "")
        if found is None or found.kind != node.type:
            missing.add(f"{node.type} {node.tool!r}")
    return sorted(missing)


def check_plan(plan: Plan, tools: ToolRegistry) -> None:
    """Every tool and pure node of ``plan`` names a function of ``tools`` of the right kind.

    Raises:
        PlanError: naming the node and the tool.
    """
    for node in plan.nodes:
        if node.type not in ("tool", "pure"):
            continue
        found = tools.get(node.tool or "")
        if found is None:
            known = ", ".join(tools.names()) or "none"
            raise PlanError(
                f"node {node.id!r} uses {node.type} {node.tool!r}, which is not registered",
                node_id=node.id,
                hint=f"Registered: {known}. Load the module that defines it with --tools.",
            )
        if found.kind != node.type:
            raise PlanError(
                f"node {node.id!r} is a {node.type} node but {node.tool!r} is registered "
                f"with @{found.kind}",
                node_id=node.id,
            )


def check_job_queues(store: Store, plan: Plan) -> None:
    """Every ``queue`` a job node of ``plan`` names is a queue the database knows (its
    child runs under that queue's limits).

    Raises:
        PlanError: naming the node and the queue.
    """
    from affidavit.runtime._queues import require_queue
    from affidavit.store.queues import check_queue_name

    for node in plan.nodes:
        queue = node.args.get("queue") if node.type == "job" else None
        if queue is None:
            continue
        try:
            require_queue(store, check_queue_name(queue))
        except ConfigError as exc:
            raise PlanError(
                f"job node {node.id!r}: {exc.message}", node_id=node.id, hint=exc.hint
            ) from None


#: The longest idempotency key accepted (the HTTP API's ``Idempotency-Key`` header has the same).
MAX_IDEMPOTENCY_KEY = 200


def check_idempotency_key(key: object) -> None:
    """``key`` is ``None`` or text a job can be found by again on either database: 1 to
    :data:`MAX_IDEMPOTENCY_KEY` characters, not all blank, no control characters (PostgreSQL
    cannot store NUL; SQLite would store it).

    Raises:
        ConfigError: naming what is wrong.
    """
    if key is None:
        return
    problem = None
    if not isinstance(key, str):
        problem = f"is of type {type(key).__name__}, not text"
    elif not key.strip():
        problem = "is empty" if not key else "is blank"
    elif len(key) > MAX_IDEMPOTENCY_KEY:
        problem = f"has {len(key)} characters (at most {MAX_IDEMPOTENCY_KEY})"
    elif any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        problem = "contains a control character"
    if problem is not None:
        raise ConfigError(
            f"the idempotency key {problem}",
            hint="Pass a stable, non-empty text key (e.g. an order id), or none at all.",
        )


def submit_job(
    store: Store,
    plan: Plan | Mapping[str, Any] | str | Path,
    input: Any = None,
    *,
    tools: ToolRegistry | None,
    idempotency_key: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    submitted_by: str | None = None,
    replay_verification: str | None = None,
    traceparent: str | None = None,
    placement: Placement | None = None,
    parent: tuple[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
    subject: str | None = None,
    durable: bool = True,
) -> tuple[JobRecord, bool]:
    """Validate and enqueue a job; returns ``(job, created)``. The same ``idempotency_key``
    (per namespace) returns the existing job and ``created=False``. Nothing is written unless
    the plan, its tools (unless ``tools`` is ``None``: then workers check them when they run the
    job) and the input are all valid.

    ``replay_verification`` (``strict`` | ``warn`` | ``human``) overrides the plan's mode for
    this job; the effective policy is recorded in ``plan_generated``. ``traceparent`` (a W3C
    trace context, e.g. an HTTP request's header) is recorded in ``job_created``, so that the
    job's spans join the trace it was submitted in. ``tags``: the job's tags (plain text,
    never encrypted: see :mod:`affidavit.core.tags`), recorded in ``job_created`` and indexed
    for ``jobs list --tag``; a job the idempotency key returns keeps the tags it has.
    ``durable=False`` commits without waiting for the disk (a child job: see
    :func:`affidavit.runtime._children.create_child`).

    Raises:
        PlanError: the plan is invalid or uses a tool that is not registered.
        IdempotencyConflict: ``idempotency_key`` names a job with another plan or input.
        ArgsResolutionError: an ``${input...}`` reference names a field the input lacks.
        ConfigError: an unknown ``replay_verification`` mode, an idempotency key that is not
            non-empty text (see :func:`check_idempotency_key`), or a malformed ``traceparent``.
        InvalidTags: tags out of bounds (:func:`affidavit.core.tags.check_tags`).
        CanonicalizationError: the input is not JSON that can be recorded.
    """
    if subject is not None:  # a plan's verifier resolves its args from the input it recorded
        raise SubjectError(
            "a subject is for agent jobs: a plan job's steps take their arguments from its "
            "input, which its verifier reads",
            hint="Submit an agent (@affidavit.agent) for data about a person.",
        )
    check_idempotency_key(idempotency_key)
    check_traceparent(traceparent)
    job_tags = check_tags(tags)
    parsed = _parsed_plan(plan)
    if tools is not None:
        check_plan(parsed, tools)
    check_job_queues(store, parsed)
    policy = _job_policy(parsed.policy.to_dict(), replay_verification)
    job_input = {} if input is None else input
    canonical_nested(job_input)  # rejects non-JSON input with its path, before anything is written
    check_input_references(parsed, job_input)
    at = utc_now()
    created_payload: dict[str, Any] = {
        "at": at,
        "input": job_input,
        "plan_name": parsed.name,
        "namespace": namespace,
        "submitted_by": submitted_by,
        "idempotency_key": idempotency_key,
    }
    if traceparent is not None:
        created_payload["traceparent"] = traceparent
    if parent is not None:  # a child job (see runtime/_children.py)
        created_payload["parent_job_id"], created_payload["parent_step_id"] = parent
    if job_tags:
        created_payload["tags"] = job_tags
    job, created = store.create_job(
        namespace=namespace,
        plan_name=parsed.name,
        idempotency_key=idempotency_key,
        submitted_by=submitted_by,
        placement=placement,
        parent=parent,
        tags=job_tags,
        durable=durable,
        events=[
            NewEvent("job_created", created_payload),
            NewEvent(
                "plan_generated",
                {
                    "at": at,
                    "task_graph": dict(parsed.task_graph),
                    "plan_hash": parsed.plan_hash,
                    "policy": policy,
                },
            ),
        ],
    )
    if not created:
        _same_submission(store, job, parsed.plan_hash, job_input)
    return job, created


def _parsed_plan(plan: Plan | Mapping[str, Any] | str | Path) -> Plan:
    """``plan`` parsed: a plan as it is, a mapping as a plan's JSON, else a plan file's path."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, Mapping):
        return Plan.parse(dict(plan))
    return Plan.from_file(plan)


def _job_policy(policy: dict[str, Any], replay_verification: str | None) -> dict[str, Any]:
    """The job's policy: its plan's or agent's ``policy``, with ``replay_verification`` (when
    given) for its mode."""
    if replay_verification is not None:
        if replay_verification not in REPLAY_VERIFICATION_MODES:
            raise ConfigError(
                f"unknown replay_verification mode {replay_verification!r}",
                hint=f"Use one of: {', '.join(REPLAY_VERIFICATION_MODES)}.",
            )
        policy["replay_verification"] = replay_verification
    return policy


def check_traceparent(traceparent: str | None) -> None:
    """Raises :class:`ConfigError` for a ``traceparent`` that is given and malformed."""
    if traceparent is not None and not valid_traceparent(traceparent):
        raise ConfigError(
            f"malformed traceparent {traceparent!r}",
            hint="A W3C trace context: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>.",
        )


def valid_traceparent(value: object) -> bool:
    """``value`` is a W3C ``traceparent`` of version 00 (lower-case hex, ids not all zero)."""
    if not isinstance(value, str) or re.fullmatch(TRACEPARENT, value) is None:
        return False
    _, trace_id, span_id, _ = value.split("-")
    return trace_id != "0" * 32 and span_id != "0" * 16


def _same_submission(store: Store, job: JobRecord, plan_hash: str, job_input: Any) -> None:
    """A key already used names the same job only for the same plan and input (a script that
    changed either and kept the key would otherwise get the old job back unnoticed).

    Raises:
        IdempotencyConflict: the key's job has another plan or input.
    """
    first = store.list_events(job.job_id, limit=2)
    key = store.job_key(job.job_id)  # a subject's job: its input is compared opened
    recorded = {e.type: opened_payload(e, key[1]) if key else e.payload for e in first}
    created, generated = recorded.get("job_created", {}), recorded.get("plan_generated", {})
    differs = [
        what
        for what, same in (
            ("plan", generated.get("plan_hash") == plan_hash),
            ("input", canonical(created.get("input")) == canonical(job_input)),
        )
        if not same
    ]
    if differs:
        raise IdempotencyConflict(
            f"idempotency key {job.idempotency_key!r} names job {job.job_id}, submitted with "
            f"another {' and '.join(differs)}"
        )


def resolve_agent(agent: Agent | str, tools: ToolRegistry) -> Agent:
    """The agent ``agent`` names (an :class:`~affidavit.runtime._agent.Agent`, or the name of
    one registered in ``tools``).

    Raises:
        PlanError: no agent of that name is registered.
    """
    if isinstance(agent, Agent):
        return agent
    found = tools.get_agent(agent)
    if found is None:
        known = ", ".join(tools.agent_names()) or "none"
        raise PlanError(
            f"agent {agent!r} is not registered",
            hint=f"Registered agents: {known}. Load the module that defines it with --tools.",
        )
    return found


@functools.lru_cache(maxsize=256)
def _signature(fn: Any) -> inspect.Signature:
    """``fn``'s signature, read once (a fan-out checks each child's input against it)."""
    return inspect.signature(fn)


def check_agent_input(agent: Agent, job_input: Any) -> None:
    """``job_input`` can be recorded and fits the agent function's keyword parameters.

    Raises:
        PlanError: it is not a JSON object, or does not fit the parameters.
        CanonicalizationError: it is not JSON that can be recorded.
    """
    canonical_nested(job_input)
    if not isinstance(job_input, dict):
        raise PlanError(
            f"the input of agent {agent.name!r} must be a JSON object (its keyword arguments), "
            f"not {type(job_input).__name__}"
        )
    try:
        _signature(agent.fn).bind(None, **job_input)
    except TypeError as exc:
        raise PlanError(
            f"the input does not fit agent {agent.name!r}: {exc}",
            hint="The input's fields are the agent function's keyword arguments after ctx.",
        ) from None
    except ValueError:
        pass  # no signature to read: the run will say


def submit_agent_job(
    store: Store,
    agent: Agent | str,
    input: Any = None,
    *,
    tools: ToolRegistry,
    idempotency_key: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    submitted_by: str | None = None,
    replay_verification: str | None = None,
    traceparent: str | None = None,
    placement: Placement | None = None,
    parent: tuple[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
    subject: str | None = None,
    durable: bool = True,
) -> tuple[JobRecord, bool]:
    """Validate and enqueue an agent job: ``job_created`` (``kind: "agent"``) and
    ``agent_started`` with the agent's name, version and policy. The input is the agent
    function's keyword arguments (a JSON object). Same idempotency rules as
    :func:`submit_job` (the same key with another agent, version or input is a conflict).
    ``parent``: ``(parent_job_id, parent_step_id)`` of a child job (recorded in its
    ``job_created`` and linked in the store). ``subject``: the person the job's data is
    about: every value a person or an agent supplies to the job is stored sealed under the
    subject's data key, so that ``affidavit erase`` can erase it (docs/privacy.md).
    ``durable`` as for :func:`submit_job`.

    Raises:
        PlanError: the agent is not registered, or the input does not fit its parameters.
        SubjectError: a malformed subject, or one that was erased.
        MasterKeyError: a subject is given and no master key is configured.
        IdempotencyConflict, ConfigError, InvalidTags, CanonicalizationError: as
            :func:`submit_job`.
    """
    new, identity = agent_job(
        agent,
        input,
        tools=tools,
        idempotency_key=idempotency_key,
        namespace=namespace,
        submitted_by=submitted_by,
        replay_verification=replay_verification,
        traceparent=traceparent,
        placement=placement,
        parent=parent,
        tags=tags,
        subject=subject,
    )
    ((job, created),) = store.create_jobs([new], durable=durable)
    if not created:
        same_agent_submission(store.list_events(job.job_id, limit=2), job, identity, new)
    return job, created


def agent_job(
    agent: Agent | str,
    input: Any = None,
    *,
    tools: ToolRegistry,
    idempotency_key: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    submitted_by: str | None = None,
    replay_verification: str | None = None,
    traceparent: str | None = None,
    placement: Placement | None = None,
    parent: tuple[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
    subject: str | None = None,
) -> tuple[NewJob, str]:
    """The agent job :func:`submit_agent_job` creates (validated, nothing written) and its
    agent hash, for :meth:`~affidavit.store.Store.create_jobs`.

    Raises:
        as :func:`submit_agent_job`.
    """
    if subject is not None:
        check_subject(subject)
    check_idempotency_key(idempotency_key)
    check_traceparent(traceparent)
    job_tags = check_tags(tags)
    found = resolve_agent(agent, tools)
    job_input = {} if input is None else input
    check_agent_input(found, job_input)
    policy = _job_policy(found.policy(), replay_verification)
    identity = agent_hash(found.name, found.version)
    at = utc_now()
    created = {
        "at": at,
        "input": job_input,
        "plan_name": found.name,
        "namespace": namespace,
        "submitted_by": submitted_by,
        "idempotency_key": idempotency_key,
        "kind": "agent",
    }
    if traceparent is not None:
        created["traceparent"] = traceparent
    if parent is not None:
        created["parent_job_id"], created["parent_step_id"] = parent
    if job_tags:
        created["tags"] = job_tags
    started: dict[str, Any] = {
        "at": at,
        "agent": found.name,
        "agent_version": found.version,
        "agent_hash": identity,
        "policy": policy,
    }
    if found.code_sha256 is not None:
        started["code_sha256"] = found.code_sha256
    if found.budget is not None:
        started["budget"] = found.budget.to_dict()
    if found.stream is not None:
        started["stream"] = found.stream.to_dict()
    events = [NewEvent("job_created", created), NewEvent("agent_started", started)]
    new = NewJob(namespace, found.name, idempotency_key, submitted_by, events, placement, parent)
    return replace(new, tags=job_tags, subject=subject), identity


def same_agent_submission(
    first: Sequence[StoredEvent], job: JobRecord, identity: str, new: NewJob
) -> None:
    """Refuse a resubmission under ``job``'s idempotency key with another agent, version
    (``identity``: its agent hash) or input than ``job`` was submitted with (``first``: its
    first events)."""
    recorded = {e.type: e.payload for e in first}
    started = recorded.get("agent_started", {})
    job_input = new.events[0].payload["input"]
    differs = [
        what
        for what, same in (
            ("agent or version", started.get("agent_hash") == identity),
            (
                "input",
                canonical(recorded.get("job_created", {}).get("input")) == canonical(job_input),
            ),
        )
        if not same
    ]
    if differs:
        raise IdempotencyConflict(
            f"idempotency key {job.idempotency_key!r} names job {job.job_id}, submitted "
            f"with another {' and '.join(differs)}"
        )
