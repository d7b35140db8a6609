"""Child jobs of agent jobs: ``ctx.start_job`` creates one (``ctx.start_jobs`` a batch, in one
transaction), ``ctx.join`` / ``ctx.join_all`` wait for them (docs/runtime.md, "Child jobs").

A child is created exactly once per (parent, sequence number): its idempotency key is
``child:<the parent's step id>``, so a parent killed between creating the child and recording
it (crash point ``child.after_create``) finds the same child on recovery. The child is linked
to its parent in the transaction that creates it.

A join is a wait without a worker: the parent's transaction that makes it wait first marks
the children awaited and reads their statuses — when all have ended it does not wait. The
transaction that ends an awaited child makes the waiting parent ``pending`` again
(``affidavit.store`` does it for every way a job ends), so the wake-up is never lost. The
parent, on whichever worker claims it, reads the ended children and records one
``child_completed`` each (its final status, chain head, event count and seal hash), the wait's
``wait_completed`` (the results) and the join's ``node_finished``, in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from affidavit.core import crash
from affidavit.core.errors import AffidavitError, StoreError
from affidavit.core.privacy import SubjectError
from affidavit.core.seal import seal_sha256
from affidavit.record import MAX_LISTED_CHILDREN, ReplayContext
from affidavit.runtime._agent import Agent
from affidavit.runtime._journal import Journal
from affidavit.runtime._run_base import Item, StepFailed, Stop
from affidavit.runtime._sdk import ToolRegistry
from affidavit.runtime._step_executor import StepSpec
from affidavit.store import JobFilter, JobRecord, Store, Transaction

if TYPE_CHECKING:
    from affidavit.runtime._agent_runner import AgentRun

#: The most children one join waits for.
MAX_JOIN = 1000
#: The events a job is created with (``job_created``, then ``plan_generated`` or
#: ``agent_started``).
CREATION_EVENTS = 2


@dataclass(frozen=True, slots=True)
class ChildResult:
    """How a child job ended: ``status`` is ``completed`` (``output`` its result),
    ``failed`` (``error``) or ``cancelled``. A failure is data the parent decides on."""

    job_id: str
    status: str
    output: Any = None
    error: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status,
            "output": self.output,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ChildResult:
        return cls(str(data["job_id"]), str(data["status"]), data.get("output"), data.get("error"))


@dataclass(frozen=True, slots=True)
class ChildHandle:
    """A child job started with ``ctx.start_job``: pass it to ``ctx.join``."""

    job_id: str


def child_key(parent_step_id: str) -> str:
    """The idempotency key of the child a parent's step creates."""
    return f"child:{parent_step_id}"


def start_args(target: Agent | str, job_input: Any, queue: str | None) -> dict[str, Any]:
    """What a ``job`` step records (and is matched against on replay)."""
    name = target.name if isinstance(target, Agent) else target
    if not isinstance(name, str) or not name:
        raise TypeError(f"ctx.start_job takes an agent or its registered name, not {target!r}")
    args: dict[str, Any] = {"agent": name, "input": {} if job_input is None else job_input}
    if queue is not None:
        args["queue"] = queue
    return args


def check_child(run: AgentRun, args: dict[str, Any]) -> None:
    """Refuse, before the step takes a sequence number (nothing recorded), a child this worker
    cannot create: an agent it does not have, an input that does not fit, an unknown queue.

    Raises:
        ValueError: what is wrong (the agent may catch it; the job's record is unchanged).
    """
    from affidavit.runtime._queues import require_queue
    from affidavit.store.queues import placement

    check_input(run, args)
    try:
        where = placement(args.get("queue"))
        if where is not None:
            require_queue(run.journal.store, where.queue)
    except AffidavitError as exc:
        raise ValueError(f"ctx.start_job: {exc.message}") from None


def check_input(run: AgentRun, args: dict[str, Any]) -> None:
    """:func:`check_child` of the agent and the input alone."""
    from affidavit.runtime._submit import check_agent_input, resolve_agent

    try:
        check_agent_input(resolve_agent(str(args["agent"]), run.parts.tools), args["input"])
    except AffidavitError as exc:
        raise ValueError(f"ctx.start_job: {exc.message}") from None


@dataclass(frozen=True, slots=True)
class CreatedChild:
    """A child as its creation left it: ``chain_head`` is the chain hash of its creation
    events (the first ``event_count``), which a parent's ``job`` step records so that
    ``verify --tree`` holds even a child it never joined to the start it saw."""

    job_id: str
    chain_head: str
    event_count: int


def create_child(
    journal: Journal,
    replay: ReplayContext,
    tools: ToolRegistry,
    spec: StepSpec,
    args: dict[str, Any],
) -> CreatedChild:
    """Create (or find, after a crash) the child of the step ``spec`` (``args``: its ``agent``
    or ``plan``, ``input`` and ``queue``).

    Raises:
        PlanError, ConfigError: the child cannot be created (an unknown agent, a bad plan).
        SubjectError: the parent has a subject.
    """
    from affidavit.runtime._submit import submit_job

    if "plan" not in args:
        (child,) = create_children(journal, replay, tools, [(spec, args)])
        return child
    (common,) = _child_common(journal, replay, tools, [(spec, args)])
    # (not synced: see create_children)
    job, created = submit_job(
        journal.store, str(args["plan"]), args["input"], **common, durable=False
    )
    crash.crash_point("child.after_create")
    if created:
        assert job.head_hash is not None
        return CreatedChild(job.job_id, job.head_hash, job.version)
    # found after a crash: it may have run since, its creation is its first events
    first = journal.store.list_events(job.job_id, limit=CREATION_EVENTS)
    return CreatedChild(job.job_id, first[-1].chain_hash, first[-1].version)


def create_children(
    journal: Journal,
    replay: ReplayContext,
    tools: ToolRegistry,
    steps: Sequence[tuple[StepSpec, dict[str, Any]]],
) -> list[CreatedChild]:
    """Create (or find, after a crash) the child agent of each step (``spec``, ``args``: its
    ``agent``, ``input`` and ``queue``), all in one transaction: after a crash (crash point
    ``child.after_create``, once, after it) every one exists, or none.

    Raises:
        PlanError, ConfigError: a child cannot be created (nothing is).
        IdempotencyConflict: a child found after a crash was made with another agent version.
        SubjectError: the parent has a subject.
    """
    from affidavit.runtime._submit import agent_job, same_agent_submission

    store = journal.store
    made = [
        agent_job(str(args["agent"]), args["input"], **common)
        for (_, args), common in zip(
            steps, _child_common(journal, replay, tools, steps), strict=True
        )
    ]
    # Not synced: a commit a power failure loses takes every later one with it (the parent's
    # record of these children too: it creates them again), and the first synced commit after
    # it — a child's first tool call, or its end — syncs it first.
    found = store.create_jobs([new for new, _ in made], durable=False)
    crash.crash_point("child.after_create")
    if journal.claim.made_runnable is not None:  # (this worker's idle loops may run them)
        journal.claim.made_runnable()
    children = []
    for (new, identity), (job, created) in zip(made, found, strict=True):
        if created:
            assert job.head_hash is not None
            children.append(CreatedChild(job.job_id, job.head_hash, job.version))
            continue
        # found after a crash: it may have run since, its creation is its first events
        first = store.list_events(job.job_id, limit=CREATION_EVENTS)
        same_agent_submission(first, job, identity, new)
        children.append(CreatedChild(job.job_id, first[-1].chain_hash, first[-1].version))
    return children


def _child_common(
    journal: Journal,
    replay: ReplayContext,
    tools: ToolRegistry,
    steps: Sequence[tuple[StepSpec, dict[str, Any]]],
) -> list[dict[str, Any]]:
    """What each step's child submission takes besides its agent or plan and input."""
    from affidavit.store.queues import placement

    store = journal.store
    if store.writer_cipher(journal.job_id) is not None:  # (its input would leave the seal)
        raise SubjectError(
            f"job {journal.job_id} has a subject: it cannot start child jobs (not supported "
            "yet: a child would record the parent's values outside the subject's key)",
            hint="Call the child's work as steps of the same job.",
        )
    namespace, submitted_by = replay.namespace, replay.submitted_by  # (job_created's)
    if namespace is None:  # (a log that does not say: the job's row does)
        parent = store.get_job(journal.job_id)
        namespace, submitted_by = parent.namespace, parent.submitted_by
    return [
        {
            "tools": tools,
            "idempotency_key": child_key(spec.step_id),
            "namespace": namespace,
            "submitted_by": submitted_by,
            "placement": placement(args.get("queue")),
            "parent": (journal.job_id, spec.step_id),
        }
        for spec, args in steps
    ]


def ended_children(
    store: Store, parent_job_id: str, job_ids: Sequence[str]
) -> list[dict[str, Any]] | None:
    """The ``child_completed`` payloads (less ``node_id``) of ``job_ids`` (children of
    ``parent_job_id``), ``None`` while one of them has not ended. Two statements for the
    common join of a parent's children (their rows listed by parent, their seals at once)."""
    wanted = set(job_ids)
    listed = store.list_jobs(JobFilter(parent=parent_job_id, limit=MAX_LISTED_CHILDREN))
    jobs = {j.job_id: j for j in listed if j.job_id in wanted}
    for job_id in job_ids:  # (a handle of another job's child, or past the page: one by one)
        if job_id not in jobs:
            jobs[job_id] = store.get_job(job_id)
        if not jobs[job_id].terminal or jobs[job_id].head_hash is None:
            return None
    seals = store.get_seals(job_ids)
    found: list[dict[str, Any]] = []
    for job_id in job_ids:
        job, seal = jobs[job_id], seals.get(job_id)
        output, error = _result_of(store, job)
        found.append(
            {
                "job_id": job_id,
                "status": job.status,
                "chain_head": job.head_hash,
                "event_count": job.version,
                "seal_sha256": None if seal is None else seal_sha256(seal),
                "output": output,
                "error": error,
            }
        )
    return found


def _result_of(store: Store, job: JobRecord) -> tuple[Any, Any]:
    """An ended child's output and error as its terminal event records them (the last of its
    log, which its seal covers; its job row is a copy an operator could edit)."""
    (last,) = store.list_events(job.job_id, after_version=job.version - 1, limit=1)
    if last.type == "job_completed":
        return last.payload.get("output"), None
    if last.type == "job_failed":
        return None, last.payload.get("error")
    return None, None


def run_join(
    journal: Journal,
    replay: ReplayContext,
    spec: StepSpec,
    job_ids: list[str],
    prelude: tuple[Item, ...] = (),
    *,
    single: bool = False,
) -> Any:
    """The join step ``spec`` (``prelude``: its ``step_called``, when not recorded yet): the
    children's results (as dicts; ``single``: the one child's, the output of a plan's job
    node) once all have ended, or :class:`Stop` ``"waiting"`` (the job waits, without a
    worker, until the last one ends)."""
    key = f"{journal.job_id}:{spec.node_id}:children"
    base = {"node_id": spec.node_id, "step_id": spec.step_id}
    waiting: tuple[Item, ...] = ()
    if key not in replay.waits:
        waiting = (
            ("node_started", {**base, "attempt": 1, "worker_id": journal.claim.worker_id}),
            (
                "job_waiting",
                {
                    "node_id": spec.node_id,
                    "wait_type": "child",
                    "correlation_key": key,
                    "reason": f"waiting for {len(job_ids)} child job(s)",
                },
            ),
        )
    while True:
        ended = ended_children(journal.store, journal.job_id, job_ids)
        if ended is not None:
            crash.crash_point("child.before_link")
            results = [{k: c[k] for k in ("job_id", "status", "output", "error")} for c in ended]
            linked = [("child_completed", {"node_id": spec.node_id, **c}) for c in ended]
            answer = {
                "node_id": spec.node_id,
                "correlation_key": key,
                "payload": results,
                "signalled_by": "children",
            }
            finished = {
                **base,
                "attempt": 1,
                "result_type": "pure",
                "output": results[0] if single else results,
                "duration_ms": 0,
            }
            journal.write(
                *prelude,
                *waiting,
                *linked,
                ("wait_completed", answer),
                ("node_finished", finished),
            )  # (not synced: a record lost to a power failure reads the same children again)
            return results[0] if single else results

        def wait(tx: Transaction) -> bool:
            statuses = tx.await_children(
                journal.job_id, job_ids
            )  # first: affidavit.store._children
            if all(statuses.get(j) in ("completed", "failed", "cancelled") for j in job_ids):
                return False  # they ended meanwhile: record them instead
            if prelude or waiting:  # (woken before the last child ended: recorded already)
                journal.append(tx, *prelude, *waiting)
            tx.set_status(journal.job_id, status="waiting", fence=journal.claim.attempt_id)
            tx.set_lease(journal.job_id, attempt_id=None, owner=None, expires_at=None)
            return True

        if journal.tx_retrying(True, wait):
            crash.crash_point("wait.after_record")
            raise Stop("waiting")


def run_job_node(
    journal: Journal, replay: ReplayContext, tools: ToolRegistry, spec: StepSpec, args: Any
) -> Any:
    """A plan's ``job`` node (``args``: its ``agent`` or ``plan``, resolved ``input`` and
    ``queue``): create its child once, in that queue, and join it; the child's result (a
    dict) is the node's output.

    Raises:
        StepFailed: the child cannot be created (the job fails, naming the node).
        Stop: ``"waiting"``, until the child ends.
    """
    from affidavit.runtime._queues import require_queue
    from affidavit.store.queues import placement

    try:
        where = placement(args.get("queue"))
        if where is not None:  # (checked on submit too; it may have been removed since)
            require_queue(journal.store, where.queue)
        child = create_child(journal, replay, tools, spec, dict(args))
    except StoreError:
        raise
    except AffidavitError as exc:
        raise StepFailed(spec.node_id, {"type": exc.code, "message": exc.message}) from exc
    return run_join(journal, replay, spec, [child.job_id], single=True)


def start_child(run: AgentRun, target: Any, job_input: Any, queue: str | None) -> ChildHandle:
    """``ctx.start_job``: the ``job`` step — create the child once, record its id."""
    (handle,) = start_children(run, target, [job_input], queue)
    return handle


def start_children(
    run: AgentRun, target: Any, inputs: Sequence[Any], queue: str | None
) -> list[ChildHandle]:
    """``ctx.start_jobs``: one ``job`` step per input, the steps as many ``ctx.start_job``
    calls record (either replays the other's record); the children not recorded yet are
    created in one transaction, and their steps recorded in one write after it."""
    if not 1 <= len(inputs) <= MAX_JOIN:
        raise ValueError(f"ctx.start_jobs takes 1 to {MAX_JOIN} inputs")
    starts = [start_args(target, job_input, queue) for job_input in inputs]
    check_child(run, starts[0])  # (the agent and the queue are the same for every one)
    for args in starts[1:]:
        check_input(run, args)
    if run.executor.cipher is not None:
        raise SubjectError(
            f"job {run.job_id} has a subject: it cannot start child jobs (not supported yet: "
            "a child would record the parent's values outside the subject's key)",
            hint="Call the child's work as steps of the same job.",
        )
    run.quiesce()
    steps = [run.next_step("job", None, args) for args in starts]
    handles: dict[str, ChildHandle] = {}
    new = []
    for (spec, _, called), args in zip(steps, starts, strict=True):
        if spec.node_id in run.replay.completed_nodes:
            crash.crash_point("agent.replay_step")
            handles[spec.node_id] = ChildHandle(str(run.replay.node_output(spec.node_id)["job_id"]))
        else:
            new.append((spec, args, called))
    if new:
        try:
            run.control.check_stopping()
            run.control.check_lease()
            created = create_children(
                run.journal, run.replay, run.parts.tools, [(spec, args) for spec, args, _ in new]
            )
            items: list[Item] = []
            for (spec, _, called), child in zip(new, created, strict=True):
                if called is not None:
                    items.append(run.plain(called))
                items.append(("node_finished", _started(spec, child)))
                handles[spec.node_id] = ChildHandle(child.job_id)
            # (not synced: a record lost to a power failure finds the same children again)
            run.journal.write(*items)
        except (Stop, StoreError) as exc:
            raise run.end(exc) from None
    return [handles[spec.node_id] for spec, _, _ in steps]


def _started(spec: StepSpec, child: CreatedChild) -> dict[str, Any]:
    """The ``node_finished`` of the ``job`` step ``spec`` that created ``child``."""
    return {
        "node_id": spec.node_id,
        "step_id": spec.step_id,
        "attempt": 1,
        "result_type": "pure",
        "output": {
            "job_id": child.job_id,
            "created_chain_head": child.chain_head,
            "created_event_count": child.event_count,
        },
        "duration_ms": 0,
    }


def join_children(run: AgentRun, handles: list[Any]) -> list[ChildResult]:
    """``ctx.join_all``: the ``join`` step — the children's results once all have ended."""
    if not handles or len(handles) > MAX_JOIN:
        raise ValueError(f"ctx.join_all takes 1 to {MAX_JOIN} handles")
    for h in handles:
        if not isinstance(h, ChildHandle):
            raise TypeError(f"ctx.join takes handles from ctx.start_job, not {h!r}")
    job_ids = [h.job_id for h in handles]
    run.quiesce()
    spec, _, called = run.next_step("join", None, {"job_ids": job_ids})
    if spec.node_id in run.replay.completed_nodes:
        crash.crash_point("agent.replay_step")
        recorded = run.replay.node_output(spec.node_id)
    else:
        try:
            prelude = (run.plain(called),) if called is not None else ()
            recorded = run_join(run.journal, run.replay, spec, job_ids, prelude)
        except Stop as stop:
            raise run.interrupted(stop) from None
        except StoreError as exc:
            raise run.end(exc) from None
    return [ChildResult.from_dict(r) for r in recorded]
