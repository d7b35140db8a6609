"""Rebuild a job's state from its event log — the log is the authority.

:meth:`ReplayContextBuilder.build_from_events` is pure (no I/O) and deterministic: the same
events give equal contexts. It is the only way the runner learns a job's state when it picks a
job up, and the traces and the decision context read the log through it.

Verification Mode does not use it: its proofs read the log on their own, in one streaming pass
(:mod:`affidavit.verify._fold`, with the plan re-derived from the recorded task graph by
:mod:`affidavit.verify._plan`). The reading is independent so that a mistake here — a state
misread, an impossible log let through — cannot also make the proof agree with it; tests hold
the two readings to the same verdicts on real and on broken logs (docs/verification.md,
"Replay invariants").

It refuses a log that no runtime following the tool-step protocol could have written, with a
:class:`~affidavit.core.errors.ReplayError` naming the first impossible event's version:

- versions run 1, 2, 3, ... for one job; ``job_created`` comes first and ``plan_generated``
  once, before any step event; nothing follows ``job_completed``/``job_failed``/
  ``job_cancelled``;
- every step event names a node of the plan with that node's step id; tool invocations belong
  to tool nodes and waits to wait/approval nodes;
- a node starts and completes only after all of its dependencies completed, and a completed node
  never starts or finishes again (G3);
- a ``tool_invocation_finished`` closes an open ``tool_invocation_started`` of the same
  invocation; ``command_committed`` follows that invocation's successful finish, once; a
  committed idempotency key is never started again (G1); a tool node completes only with a
  committed invocation;
- a ``wait_completed`` answers a ``job_waiting`` with the same correlation key, once; a
  ``job_resumed`` follows a ``job_parked``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from affidavit.core.agent_steps import (
    NODE_TYPE_OF_KIND,
    agent_hash,
    agent_node_id,
    agent_step_id,
)
from affidavit.core.canonical import canonical
from affidavit.core.errors import AffidavitError, ReplayError
from affidavit.core.events import COMPLETED_RESULT_TYPES, FAILED_RESULT_TYPES
from affidavit.core.plan import Plan
from affidavit.core.privacy import JobCipher
from affidavit.record._opened import opened_payload
from affidavit.store.base import StoredEvent

TERMINAL = ("completed", "failed", "cancelled")


@dataclass
class Invocation:
    """What the log says about one idempotency key."""

    key: str
    node_id: str
    step_id: str
    tool_name: str
    started: list[dict[str, Any]] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)
    committed: bool = False

    @property
    def pending(self) -> dict[str, Any] | None:
        """The last ``tool_invocation_started`` not closed by a ``tool_invocation_finished``."""
        closed = {f["invocation_id"] for f in self.finished}
        open_ = [s for s in self.started if s["invocation_id"] not in closed]
        return open_[-1] if open_ else None

    @property
    def result(self) -> Any:
        for f in reversed(self.finished):
            if f["outcome"] == "success":
                return f.get("result")
        return None


@dataclass
class ReplayContext:
    """A job's state as its log tells it (docs/runtime.md, "Replay: the log is the authority")."""

    job_id: str | None = None
    input: Any = None
    kind: str = "plan"  # or "agent": a job whose steps an agent function decides as it runs
    agent: dict[str, Any] | None = None  # an agent job's agent_started payload
    agent_steps: dict[int, dict[str, Any]] = field(default_factory=dict)  # seq -> step_called
    namespace: str | None = None
    submitted_by: str | None = None  # job_created's: who may not decide the job's approvals
    forked_from: dict[str, Any] | None = None  # job_created's: the source of a fork
    task_graph: dict[str, Any] | None = None
    plan_hash: str | None = None
    policy: dict[str, Any] | None = None
    step_ids: dict[str, str] = field(default_factory=dict)  # node id -> step id
    node_finished: dict[str, dict[str, Any]] = field(default_factory=dict)  # latest per node
    # the latest failed node_finished per node (a compensated node's is the failure compensated)
    failures: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_attempts: dict[str, int] = field(default_factory=dict)
    finish_order: list[tuple[str, str]] = field(default_factory=list)  # (node_id, result_type)
    invocations: dict[str, Invocation] = field(default_factory=dict)
    committed_commands: dict[str, str] = field(default_factory=dict)  # command_id -> key
    state_changes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by step
    waits: dict[str, dict[str, Any]] = field(default_factory=dict)  # correlation key -> wait
    completed_waits: dict[str, dict[str, Any]] = field(default_factory=dict)
    # correlation key -> the approval_recorded decisions of an approval still open
    approval_votes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    parked: dict[str, Any] | None = None  # the job_parked payload while the job is parked
    parked_version: int | None = None  # and that event's version: the park's identity
    accepted_steps: set[str] = field(default_factory=set)  # mismatches a person let through
    warnings: list[dict[str, Any]] = field(default_factory=list)  # confirmation_warning
    status: str = "pending"
    output: Any = None
    error: Any = None
    resumptions: list[dict[str, Any]] = field(default_factory=list)
    event_count: int = 0
    # the job's stream (stream_emitted): how many values, their canonical bytes in all, and
    # how many of them the agent function emitted itself (a recovered run skips as many)
    stream_values: int = 0
    stream_bytes: int = 0
    agent_emits: int = 0
    # node id -> its invocations in log order, rebuilt when invocations were added (they are
    # never removed or replaced): node_output looks a node up instead of scanning every key
    _by_node: dict[str, list[Invocation]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _by_node_size: int = field(default=-1, init=False, repr=False, compare=False)

    @property
    def completed_nodes(self) -> set[str]:
        return {
            n for n, f in self.node_finished.items() if f["result_type"] in COMPLETED_RESULT_TYPES
        }

    @property
    def completed_command_ids(self) -> set[str]:
        return set(self.committed_commands)

    @property
    def completed_tool_invocations(self) -> dict[str, Any]:
        """Idempotency key → recorded result, for every committed invocation."""
        return {k: inv.result for k, inv in self.invocations.items() if inv.committed}

    @property
    def pending_tool_invocations(self) -> dict[str, dict[str, Any]]:
        """Idempotency key → the ``tool_invocation_started`` payload still open."""
        return {k: p for k, inv in self.invocations.items() if (p := inv.pending) is not None}

    @property
    def approved_keys(self) -> set[str]:
        """Correlation keys answered by a signal that did not deny (``approved: false``)."""
        return {
            k
            for k, done in self.completed_waits.items()
            if not (
                isinstance(done.get("payload"), dict) and done["payload"].get("approved") is False
            )
        }

    @property
    def recorded_outputs(self) -> dict[str, Any]:
        """Node id → recorded output, for every completed node."""
        return {n: self.node_output(n) for n in self.completed_nodes}

    def node_output(self, node_id: str) -> Any:
        """The recorded output of a completed node: a pure/wait node's ``output``, a tool
        node's committed result."""
        finished = self.node_finished[node_id]
        if "output" in finished:
            return finished["output"]
        for inv in self._invocations_of(node_id):
            if inv.committed:
                return inv.result
        return None

    def _invocations_of(self, node_id: str) -> list[Invocation]:
        if self._by_node_size != len(self.invocations):
            by_node: dict[str, list[Invocation]] = {}
            for inv in self.invocations.values():
                by_node.setdefault(inv.node_id, []).append(inv)
            self._by_node, self._by_node_size = by_node, len(self.invocations)
        return self._by_node.get(node_id, [])


class ReplayContextBuilder:
    """Folds a log into a :class:`ReplayContext`, refusing impossible logs."""

    def __init__(self) -> None:
        self.ctx = ReplayContext()
        self._plan: Plan | None = None  # parsed from plan_generated; see :attr:`plan`
        self._agent_nodes: dict[str, str] = {}  # agent job: node id -> node type
        self._completed_at: dict[str, int] = {}  # node id -> version it completed at
        self._committed_nodes: set[str] = set()  # tool nodes with a committed invocation
        self._version = 0
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "job_created": self._job_created,
            "plan_generated": self._plan_generated,
            "agent_started": self._agent_started,
            "step_called": self._step_called,
            "node_started": self._node_started,
            "tool_invocation_started": self._invocation_started,
            "tool_invocation_finished": self._invocation_finished,
            "command_committed": self._command_committed,
            "state_changed": self._state_changed,
            "node_finished": self._node_finished,
            "job_waiting": self._job_waiting,
            "wait_completed": self._wait_completed,
            "approval_recorded": self._approval_recorded,
            "job_parked": self._job_parked,
            "job_resumed": self._job_resumed,
            "confirmation_warning": self._confirmation_warning,
            "step_compensated": self._step_compensated,
            "job_completed": self._job_completed,
            "job_failed": self._job_failed,
            "job_cancelled": self._job_cancelled,
            "stream_emitted": self._stream_emitted,
            "child_completed": self._child_completed,
        }

    @classmethod
    def build_from_events(
        cls, events: Iterable[StoredEvent], cipher: JobCipher | None = None
    ) -> ReplayContext:
        """The context of the log ``events`` (in version order, starting at 1); ``cipher``:
        the job's data key, which opens its sealed values (a subject's job).

        Raises:
            ReplayError: the log is structurally impossible; ``version`` names the first
                offending event.
            SealedValueError: a sealed value does not open under ``cipher``.
        """
        builder = cls()
        for event in events:
            builder.add(event, None if cipher is None else opened_payload(event, cipher))
        return builder.ctx

    @property
    def plan(self) -> Plan | None:
        """The plan of ``plan_generated``, parsed (``None`` before it)."""
        return self._plan

    @property
    def agent(self) -> dict[str, Any] | None:
        """An agent job's ``agent_started`` payload (``None`` for a plan job, or before it)."""
        return self.ctx.agent

    def add(self, event: StoredEvent, payload: Any = None) -> None:
        """Fold one more event (the next version) into :attr:`ctx`; ``payload``, when given,
        is ``event.payload`` already decoded by the caller.

        Raises:
            ReplayError: the event is impossible after the ones before it.
        """
        ctx = self.ctx
        self._version = event.version
        if event.version != ctx.event_count + 1:
            self._fail(f"version {event.version} follows {ctx.event_count}; versions run 1, 2, 3")
        if ctx.job_id is not None and event.job_id != ctx.job_id:
            self._fail(f"belongs to job {event.job_id!r}, not {ctx.job_id!r}")
        if ctx.status in TERMINAL:
            self._fail(f"{event.type} after the job was {ctx.status}")
        handler = self._handlers.get(event.type)
        if handler is None:
            self._fail(f"unknown event type {event.type!r}")
        if event.version == 1 and event.type != "job_created":
            self._fail("the log does not start with job_created")
        if (
            event.type not in ("job_created", "plan_generated", "agent_started")
            and self._plan is None
            and self.ctx.agent is None
        ):
            self._fail(f"{event.type} before plan_generated")
        ctx.event_count += 1
        ctx.job_id = event.job_id
        try:
            handler(event.payload if payload is None else payload)
        except ReplayError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self._fail(f"malformed {event.type} payload: {type(exc).__name__} {exc}")

    # --- helpers ------------------------------------------------------------------------------

    def _fail(self, message: str) -> NoReturn:
        raise ReplayError(message, version=self._version)

    def _step(self, p: dict[str, Any], *kinds: str) -> str:
        """The event's node id, checked against the plan (type and step id)."""
        node_id = p["node_id"]
        node_type = self._node_type(node_id)
        if node_type is None:
            self._fail(
                f"node {node_id!r} is not in the plan"
                if self._plan is not None
                else f"node {node_id!r} was not called (no step_called before it)"
            )
        if kinds and node_type not in kinds:
            self._fail(f"node {node_id!r} is a {node_type} node, not {' or '.join(kinds)}")
        if "step_id" in p and p["step_id"] != self.ctx.step_ids[node_id]:
            self._fail(
                f"step id {p['step_id']!r} of node {node_id!r} is not the plan's "
                f"{self.ctx.step_ids[node_id]!r}"
            )
        return str(node_id)

    def _node_type(self, node_id: Any) -> str | None:
        if self._plan is not None:
            node = self._plan.by_id.get(node_id)
            return None if node is None else node.type
        return self._agent_nodes.get(node_id)

    def _check_ready(self, node_id: str, what: str) -> None:
        if node_id in self._completed_at:
            self._fail(
                f"node {node_id!r} {what} again after it completed at event "
                f"{self._completed_at[node_id]}"
            )
        if self._plan is None:
            return  # an agent job's calls depend on nothing recorded: the code decided
        for dep in self._plan.node(node_id).depends_on:
            if dep not in self._completed_at:
                self._fail(f"node {node_id!r} {what} before its dependency {dep!r} completed")

    # --- one handler per event type -----------------------------------------------------------

    def _job_created(self, p: dict[str, Any]) -> None:
        if self._version != 1:
            self._fail("job_created is not the first event")
        self.ctx.input = p.get("input")
        self.ctx.namespace = p.get("namespace")
        self.ctx.submitted_by = p.get("submitted_by")
        self.ctx.forked_from = p.get("forked_from")

    def _plan_generated(self, p: dict[str, Any]) -> None:
        ctx = self.ctx
        if self._plan is not None or ctx.agent is not None:
            self._fail("a second plan_generated, or one in an agent job")
        try:
            self._plan = Plan.of_recorded_graph(p["task_graph"], p.get("plan_hash"))
        except AffidavitError as exc:
            self._fail(f"plan_generated holds an invalid task graph: {exc.message}")
        assert ctx.job_id is not None
        ctx.task_graph = p["task_graph"]
        ctx.plan_hash = p.get("plan_hash")
        ctx.policy = p.get("policy")
        ctx.step_ids = self._plan.step_ids(ctx.job_id)
        if ctx.forked_from is not None:
            self._reuse(ctx.forked_from["reused"])

    def _reuse(self, reused: list[dict[str, Any]]) -> None:
        """A fork's prefix (``job_created``'s ``forked_from``): its nodes completed with the
        source's recorded outputs, as if they had finished here; they never run in this job."""
        assert self._plan is not None
        for step in reused:
            node_id = step["node_id"]
            if node_id not in self._plan.by_id:
                self._fail(f"the fork reuses node {node_id!r}, which is not in the plan")
            self._check_ready(node_id, "reused")
            self._reused(step)

    def _reused(self, step: dict[str, Any]) -> None:
        node_id = step["node_id"]
        self.ctx.node_finished[node_id] = {
            "node_id": node_id,
            "step_id": self.ctx.step_ids[node_id],
            "result_type": "pure",
            "output": step["output"],
            "reused_from": step["step_id"],
        }
        self._completed_at[node_id] = self._version

    def _agent_started(self, p: dict[str, Any]) -> None:
        ctx = self.ctx
        if self._plan is not None or ctx.agent is not None:
            self._fail("a second agent_started, or one in a plan job")
        if not isinstance(p["agent"], str) or not isinstance(p["agent_version"], str | None):
            self._fail("agent_started names no agent and version")
        if p.get("agent_hash") != agent_hash(p["agent"], p["agent_version"]):
            self._fail("agent_started's agent_hash is not the hash of its agent and version")
        ctx.kind = "agent"
        ctx.agent = p
        ctx.policy = p.get("policy")
        if ctx.forked_from is not None:
            for step in ctx.forked_from["reused"]:
                self._step_called(
                    {
                        "seq": step["seq"],
                        "node_id": step["node_id"],
                        "step_id": agent_step_id(str(ctx.job_id), step["seq"], step["kind"]),
                        "kind": step["kind"],
                        "tool_name": step.get("tool_name"),
                        "args": step.get("args"),
                        "args_hash": step.get("args_hash"),
                    }
                )
                self._reused(step)

    def _step_called(self, p: dict[str, Any]) -> None:
        ctx = self.ctx
        if ctx.agent is None:
            self._fail("step_called in a plan job")
        assert ctx.job_id is not None
        seq, kind = p["seq"], p["kind"]
        if type(seq) is not int or seq != len(ctx.agent_steps):
            self._fail(f"step_called with seq {seq!r}; the next is {len(ctx.agent_steps)}")
        if kind not in NODE_TYPE_OF_KIND:
            self._fail(f"step_called of unknown kind {kind!r}")
        node_id = agent_node_id(seq)
        if p["node_id"] != node_id:
            self._fail(f"step_called {seq} names node {p['node_id']!r}, not {node_id!r}")
        step = agent_step_id(ctx.job_id, seq, kind)
        if p["step_id"] != step:
            self._fail(f"step id {p['step_id']!r} of call {seq} is not {step!r}")
        ctx.agent_steps[seq] = p
        ctx.step_ids[node_id] = step
        self._agent_nodes[node_id] = NODE_TYPE_OF_KIND[kind]

    def _node_started(self, p: dict[str, Any]) -> None:
        ctx = self.ctx
        node_id = self._step(p)
        self._check_ready(node_id, "started")
        ctx.node_attempts[node_id] = max(ctx.node_attempts.get(node_id, 0), int(p["attempt"]))
        if ctx.status != "waiting":
            ctx.status = "running"

    def _invocation_started(self, p: dict[str, Any]) -> None:
        node_id = self._step(p, "tool")
        self._check_ready(node_id, "started an invocation")
        key = p["idempotency_key"]
        inv = self.ctx.invocations.get(key)
        if inv is None:
            inv = self.ctx.invocations[key] = Invocation(key, node_id, p["step_id"], p["tool_name"])
        elif inv.node_id != node_id:
            self._fail(f"idempotency key {key} was started by node {inv.node_id!r} before")
        if inv.committed:
            self._fail(f"idempotency key {key} started again after it was committed")
        if inv.pending is not None:
            self._fail(
                f"idempotency key {key} started while invocation "
                f"{inv.pending['invocation_id']} is still open"
            )
        inv.started.append(p)

    def _invocation_finished(self, p: dict[str, Any]) -> None:
        node_id = self._step(p, "tool")
        key = p["idempotency_key"]
        inv = self.ctx.invocations.get(key)
        pending = inv.pending if inv is not None else None
        if inv is None or inv.node_id != node_id:
            self._fail(f"tool_invocation_finished for key {key}, which was never started")
        if pending is None or pending["invocation_id"] != p["invocation_id"]:
            self._fail(
                f"tool_invocation_finished for invocation {p['invocation_id']}, which is not open"
            )
        if p["outcome"] not in ("success", "failure", "timeout", "lost", "unknown"):
            self._fail(f"unknown invocation outcome {p['outcome']!r}")
        inv.finished.append(p)

    def _command_committed(self, p: dict[str, Any]) -> None:
        node_id = self._step(p, "tool")
        key = p.get("idempotency_key")
        inv = self.ctx.invocations.get(key or "")
        last = inv.finished[-1] if inv is not None and inv.finished else None
        if inv is None or last is None or last["outcome"] != "success":
            self._fail(f"command_committed for key {key} without a successful finish")
        if node_id != inv.node_id:
            self._fail(f"command_committed names node {node_id!r}, key {key} is {inv.node_id!r}'s")
        if last["invocation_id"] != p["command_id"]:
            self._fail(
                f"command {p['command_id']} does not match the finished invocation "
                f"{last['invocation_id']}"
            )
        if inv.committed:
            self._fail(f"idempotency key {key} committed twice")
        inv.committed = True
        self._committed_nodes.add(inv.node_id)
        self.ctx.committed_commands[p["command_id"]] = key or ""

    def _state_changed(self, p: dict[str, Any]) -> None:
        self._step(p, "tool")
        self.ctx.state_changes.setdefault(p["step_id"], []).extend(p["state_changes"])

    def _node_finished(self, p: dict[str, Any]) -> None:
        ctx = self.ctx
        node_id = self._step(p)
        result_type = p["result_type"]
        if result_type in COMPLETED_RESULT_TYPES:
            self._check_ready(node_id, "finished")
        elif node_id in self._completed_at:
            self._check_ready(node_id, "finished")  # fails: it completed already
        if result_type == "side_effect_committed" and node_id not in self._committed_nodes:
            self._fail(f"node {node_id!r} finished as side_effect_committed without a commit")
        ctx.node_finished[node_id] = p
        if result_type in FAILED_RESULT_TYPES:
            ctx.failures[node_id] = p
        ctx.finish_order.append((node_id, result_type))
        if result_type in COMPLETED_RESULT_TYPES:
            self._completed_at[node_id] = self._version

    def _job_waiting(self, p: dict[str, Any]) -> None:
        # (a tool's call waits for its approval as the tool node: see runtime._approvals)
        node_id = self._step(p, *(("tool",) if "call" in p else ("wait", "approval", "job")))
        key = p["correlation_key"]
        if key in self.ctx.waits:
            self._fail(f"a second job_waiting for correlation key {key!r}")
        self.ctx.waits[key] = {**p, "node_id": node_id}
        self.ctx.status = "waiting"

    def _wait_completed(self, p: dict[str, Any]) -> None:
        key = p["correlation_key"]
        wait = self.ctx.waits.get(key)
        if wait is None:
            self._fail(f"wait_completed for correlation key {key!r}, which nobody waits for")
        if key in self.ctx.completed_waits:
            self._fail(f"a second wait_completed for correlation key {key!r}")
        if p["node_id"] != wait["node_id"]:
            self._fail(
                f"wait_completed names node {p['node_id']!r}, the wait is {wait['node_id']!r}'s"
            )
        self.ctx.completed_waits[key] = p
        self.ctx.status = "pending"

    def _approval_recorded(self, p: dict[str, Any]) -> None:
        key = p["correlation_key"]
        wait = self.ctx.waits.get(key)
        if wait is None or wait.get("wait_type") != "approval" or key in self.ctx.completed_waits:
            self._fail(f"approval_recorded for {key!r}, which is no open approval")
        self.ctx.approval_votes.setdefault(key, []).append(p)

    def _job_parked(self, p: dict[str, Any]) -> None:
        if p.get("node_id") is not None:
            self._step(p)
        self.ctx.parked = p
        self.ctx.parked_version = self._version
        self.ctx.status = "parked"

    def _job_resumed(self, p: dict[str, Any]) -> None:
        ctx = self.ctx
        if ctx.parked is None:
            self._fail("job_resumed while the job is not parked")
        if p["decision"] == "continue" and ctx.parked.get("reason") == "replay_verification":
            detail = ctx.parked.get("detail") or {}
            ctx.accepted_steps.update(m["step_id"] for m in detail.get("mismatches", []))
            if ctx.parked.get("step_id"):
                ctx.accepted_steps.add(ctx.parked["step_id"])
        ctx.resumptions.append(p)
        ctx.parked = None
        ctx.parked_version = None
        ctx.status = "pending"

    def _confirmation_warning(self, p: dict[str, Any]) -> None:
        self._step(p, "tool")
        self.ctx.warnings.append(p)

    def _step_compensated(self, p: dict[str, Any]) -> None:
        self._step(p, "tool")

    def _job_completed(self, p: dict[str, Any]) -> None:
        self.ctx.status = "completed"
        self.ctx.output = p.get("output")

    def _job_failed(self, p: dict[str, Any]) -> None:
        self.ctx.status = "failed"
        self.ctx.error = p.get("error")

    def _child_completed(self, p: dict[str, Any]) -> None:
        # a join's view of one child (the join's wait_completed carries the results)
        wait = next((w for w in self.ctx.waits.values() if w.get("node_id") == p["node_id"]), None)
        if wait is None or wait.get("wait_type") != "child":
            self._fail(f"child_completed for node {p['node_id']!r}, which waits for no child")

    def _job_cancelled(self, p: dict[str, Any]) -> None:
        # a job cancelled while parked is parked no more: no park is left to decide about
        self.ctx.parked = None
        self.ctx.parked_version = None
        self.ctx.status = "cancelled"

    def _stream_emitted(self, p: dict[str, Any]) -> None:
        ctx = self.ctx
        if p["seq"] != ctx.stream_values:
            self._fail(f"stream value {p['seq']!r} follows {ctx.stream_values} values")
        if p.get("node_id") is not None:
            self._step(p)
        else:
            ctx.agent_emits += 1
        try:
            ctx.stream_bytes += len(canonical(p["value"]))
        except AffidavitError:
            self._fail(f"stream value {p['seq']} is not canonical JSON")
        ctx.stream_values += 1


def build_from_events(
    events: Iterable[StoredEvent], cipher: JobCipher | None = None
) -> ReplayContext:
    """Shorthand for :meth:`ReplayContextBuilder.build_from_events`."""
    return ReplayContextBuilder.build_from_events(events, cipher)
