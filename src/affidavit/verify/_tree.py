"""``verify --tree``: a job and every descendant (child jobs, ``ctx.start_job``), as one proof.

The contract, in order:

(1) every job of the tree verifies on its own (:func:`~affidavit.verify.verify_job`);
(2) each ``child_completed`` in a verified parent's log names a child whose current record is
    the one the parent saw: the same final status, chain head, event count and seal hash — a
    child rewritten, extended or re-sealed (even with the operator's key) fails its parent's
    tree;
(3) every child — joined or not, whether its parent's log or the store lists it — names that
    parent and a step of it (its ``job_created``'s ``parent_job_id`` and ``parent_step_id``)
    that is a ``job`` step the parent's log started; when the parent's log recorded the child
    that step created (an agent's ``ctx.start_job`` records its id and the chain hash of its
    creation events), it is this child, created as recorded — a child rewritten from its
    start and re-sealed fails even when its parent never joined it;
(4) the descendants the store lists for a job (children it never joined) are verified too.

What (3) cannot bind is the end of a child its parent never joined: the parent never saw it.
Such a child's end is held by its own seal and, against the key's holder, by the
transparency log, which (1) consults (a re-seal after the seal was logged fails).

Read-only; the links come from the parents' logs, which (1) verified.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.agent_steps import agent_step_id
from affidavit.core.errors import JobNotFound, UnreadableEventError
from affidavit.core.seal import seal_sha256
from affidavit.store import JobFilter, Store
from affidavit.verify._plan import PlanProblem, read_plan
from affidavit.verify.result import VerificationResult
from affidavit.verify.verification import KeyLike, verify_job

#: The most jobs one tree verification reads (a bound on a hostile tree's size).
MAX_TREE_JOBS = 100_000
_LISTED = 10_000


@dataclass(frozen=True, slots=True)
class TreeLink:
    """One parent-to-child link: ``problem`` is empty when the child is the one recorded."""

    parent_job_id: str
    child_job_id: str
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent_job_id": self.parent_job_id,
            "child_job_id": self.child_job_id,
            "ok": not self.problem,
            "problem": self.problem or None,
        }


@dataclass(frozen=True, slots=True)
class TreeResult:
    """The results of every job of the tree (the root first) and of every link."""

    job_id: str
    results: list[VerificationResult] = field(default_factory=list)
    links: list[TreeLink] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and not any(link.problem for link in self.links)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "ok": self.ok,
            "jobs": [r.to_dict() for r in self.results],
            "links": [link.to_dict() for link in self.links],
        }


def verify_tree(
    store: Store, job_id: str, *, trusted_keys: Iterable[KeyLike] | None = None
) -> TreeResult:
    """Verify ``job_id`` and every descendant (see the module docstring); never changes
    anything.

    Raises:
        JobNotFound: no such job (the root).
        StoreError: the database cannot be read.
    """
    keys = list(trusted_keys) if trusted_keys is not None else None
    tree = TreeResult(job_id)
    queue, seen = [job_id], {job_id}
    while queue:
        current = queue.pop(0)
        result = verify_job(store, current, trusted_keys=keys)  # (1)
        tree.results.append(result)
        log = _ParentLog.read(store, current)
        listed = [j.job_id for j in store.list_jobs(JobFilter(parent=current, limit=_LISTED))]
        linked = list(dict.fromkeys([*log.joined, *log.started.values()]))
        for child in [*linked, *sorted(set(listed) - set(linked))]:
            recorded = log.joined.get(child)
            problem = _link_problem(store, current, recorded) if recorded is not None else ""
            tree.links.append(TreeLink(current, child, problem or log.start_problem(store, child)))
        for child in [*linked, *sorted(set(listed) - set(linked))]:  # (4)
            if child in seen or len(seen) >= MAX_TREE_JOBS:
                continue
            seen.add(child)
            try:
                store.get_job(child)
            except JobNotFound:
                continue  # (its link says so)
            queue.append(child)
    return tree


# the events of a parent's log that say something of its children
_READ = frozenset(
    {
        "child_completed",
        "job_created",
        "plan_generated",
        "step_called",
        "node_finished",
        "agent_started",
    }
)


@dataclass
class _ParentLog:
    """What a parent's log says of its children: the ``child_completed`` of each joined child,
    its ``job`` steps (step id → node id) and, of those that recorded it, the child each
    created (node id → the start step's output)."""

    job_id: str
    joined: dict[str, dict[str, Any]] = field(default_factory=dict)
    job_steps: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    agent: bool = False

    @property
    def started(self) -> dict[str, str]:
        """Node id → the id of the child the node's start recorded."""
        return {n: str(o["job_id"]) for n, o in self.outputs.items() if "job_id" in o}

    @classmethod
    def read(cls, store: Store, job_id: str) -> _ParentLog:
        log = cls(job_id)
        agent_jobs: set[str] = set()  # an agent's job steps (ctx.start_job)
        calls = 0  # an agent's calls recorded (a fork's reused ones included)
        for e in store.iter_events(job_id):
            if e.type not in _READ:
                continue
            try:
                p = e.payload
            except UnreadableEventError:
                continue  # ((1) reports the row)
            if not isinstance(p, dict):
                continue
            node = p.get("node_id")
            if e.type == "child_completed":
                log.joined.setdefault(str(p.get("job_id")), p)
            elif e.type == "job_created" and isinstance(p.get("forked_from"), dict):
                calls += len(p["forked_from"].get("reused") or ())
            elif e.type == "plan_generated":  # every job node's step, started or not
                log.job_steps.update(_plan_job_steps(job_id, p))
            elif e.type == "step_called":
                calls += 1
                if p.get("kind") == "job":
                    agent_jobs.add(str(node))
                    log.job_steps[str(p.get("step_id"))] = str(node)
            elif e.type == "node_finished" and node in agent_jobs:
                if isinstance(p.get("output"), dict):
                    log.outputs[str(node)] = p["output"]
            elif e.type == "agent_started":
                log.agent = True
        if log.agent:  # a parent stopped between creating a child and recording the start
            log.job_steps.setdefault(agent_step_id(job_id, calls, "job"), f"#{calls}")
        return log

    def start_problem(self, store: Store, child_id: str) -> str:
        """(3) for one child: what is wrong with its start, or ``""``."""
        try:
            store.get_job(child_id)
        except JobNotFound:
            return f"child job {child_id} is not in the store"
        first = store.list_events(child_id, limit=1)
        try:
            created = first[0].payload if first and first[0].type == "job_created" else {}
        except UnreadableEventError:
            return f"child job {child_id}'s job_created cannot be read"
        if not isinstance(created, dict):
            created = {}
        named, step = created.get("parent_job_id"), created.get("parent_step_id")
        if named != self.job_id:
            return f"child job {child_id} names parent {named!r}, not {self.job_id}"
        node = self.job_steps.get(str(step))
        if node is None:
            return (
                f"child job {child_id} names step {step!r} of its parent, which is no job step "
                "the parent's log started"
            )
        output = self.outputs.get(node)
        if output is None:
            return ""  # (a plan's job node, or a start recorded before starts named the child)
        if output.get("job_id") != child_id:
            return f"the parent's step {node} started job {output.get('job_id')}, not {child_id}"
        head, count = output.get("created_chain_head"), output.get("created_event_count")
        if head is None:
            return ""  # (recorded before starts held the child's creation)
        at = (
            store.list_events(child_id, after_version=count - 1, limit=1)
            if isinstance(count, int) and not isinstance(count, bool) and count >= 1
            else []
        )
        if not at or at[0].version != count or at[0].chain_hash != head:
            return (
                f"child job {child_id} is not the job its parent's step {node} created: its "
                "creation events differ from those the parent recorded"
            )
        return ""


def _plan_job_steps(job_id: str, generated: dict[str, Any]) -> dict[str, str]:
    """Step id → node id of each job node of a recorded plan (none when it cannot be read:
    (1) reports that)."""
    try:
        view = read_plan(generated.get("task_graph"), generated.get("plan_hash"), job_id)
    except PlanProblem:
        return {}
    return {view.steps[n]: n for n, kind in view.node_type.items() if kind == "job"}


def _link_problem(store: Store, parent: str, recorded: dict[str, Any]) -> str:
    """(2) for one ``child_completed`` of ``parent``: what differs, or ``""``."""
    child_id = str(recorded.get("job_id"))
    try:
        child = store.get_job(child_id)
    except JobNotFound:
        return f"child job {child_id} is not in the store"
    seal = store.get_seal(child_id)
    now = {
        "status": child.status,
        "chain_head": child.head_hash,
        "event_count": child.version,
        "seal_sha256": None if seal is None else seal_sha256(seal),
    }
    differs = [name for name, value in now.items() if recorded.get(name) != value]
    if differs:
        return (
            f"child job {child_id} is not the one its parent recorded: {', '.join(differs)} differ"
        )
    return _result_problem(store, child_id, child.version, recorded)


def _result_problem(store: Store, child_id: str, version: int, recorded: dict[str, Any]) -> str:
    """The result the parent recorded against the child's own terminal event (its last: the
    seal covers it) — never the job row, which an operator can edit: ``""`` when they agree."""
    last = store.list_events(child_id, after_version=version - 1, limit=1) if version > 0 else []
    if not last or last[0].version != version:
        return f"child job {child_id} has no terminal event at its recorded length"
    return child_result_problem(child_id, recorded, last[0].type, last[0].payload)


def child_result_problem(
    child_id: str, recorded: dict[str, Any], terminal_type: str, terminal: dict[str, Any]
) -> str:
    """Whether a parent's ``child_completed`` (``recorded``) holds the output and error of
    the child's terminal event (``terminal_type``, its payload): ``""``, or what differs."""
    result = {
        "output": terminal.get("output") if terminal_type == "job_completed" else None,
        "error": terminal.get("error") if terminal_type == "job_failed" else None,
    }
    differs = [name for name, value in result.items() if recorded.get(name) != value]
    if differs:
        return (
            f"the parent recorded a {' and '.join(differs)} of child job {child_id} that is not "
            f"the one its {terminal_type} holds"
        )
    return ""
