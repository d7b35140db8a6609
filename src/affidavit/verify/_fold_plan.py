"""The handlers of the events that set up what a job runs: ``job_created``, the plan
(``plan_generated``) and an agent job's steps (``agent_started``, ``step_called``)."""

from __future__ import annotations

from typing import Any

from affidavit.core.agent_steps import AGENT_KINDS, agent_hash, agent_node_id, agent_step_id
from affidavit.core.canonical import canonical_of_parsed, canonical_sha256
from affidavit.core.errors import AffidavitError
from affidavit.core.plan import idempotency_key_of
from affidavit.verify._budget import BudgetFold
from affidavit.verify._fold_state import (
    _CALLED_KINDS,
    _NO_DEPS,
    _WAIT_KINDS,
    FoldState,
    _same_json,
    _sha256,
)
from affidavit.verify._plan import PlanProblem, PlanView, read_plan
from affidavit.verify._violation import _Violation


class PlanEvents(FoldState):
    """The handlers of the plan and the agent's steps (see :mod:`affidavit.verify._fold`)."""

    # --- handlers -------------------------------------------------------------------------------

    def _job_created(self, p: dict[str, Any]) -> None:
        if self._version != 1:
            raise _Violation("plan", "job_created is not the first event")
        self.created_payload = p
        self.approvals.created(p)

    def _plan_generated(self, p: dict[str, Any]) -> None:
        if self.agent:
            raise _Violation("plan", "plan_generated in an agent job")
        if self._exec is not None:
            raise _Violation("plan", "a second plan_generated")
        if self._version == 1:  # reported first; the plan is still read, for the hashes
            self.violate("plan", 1, "plan_generated: the log does not start with job_created")
        graph = p.get("task_graph")
        recorded = p.get("plan_hash")
        view: PlanView | None = None
        problem = "no task graph"
        try:
            view = read_plan(graph, recorded, self.job_id)
        except PlanProblem as exc:
            problem = str(exc)
        # The execution hash follows docs/formats.md §5 even when the plan itself is broken.
        if isinstance(recorded, str):
            self.plan_hash = recorded
        elif view is not None:
            self.plan_hash = view.plan_hash
        else:
            try:
                self.plan_hash = canonical_sha256(graph) if graph is not None else ""
            except AffidavitError:
                self.plan_hash = ""
        self._exec = _sha256(self.plan_hash.encode())
        for node_id, result_type in self._finished_before_plan:
            self._exec.update(f"{node_id}:{result_type}\n".encode())
        self._finished_before_plan.clear()
        if view is None:
            raise _Violation("plan", problem)
        self.has_plan = True
        self.steps = view.steps
        self.node_type = view.node_type
        self.deps = view.deps
        self.order = view.order
        self.tools = view.tools
        depended = {dep for deps in view.deps.values() for dep in deps}
        self.sinks = tuple(n for n in view.order if n not in depended)
        self._fast_steps = {
            n: step
            for n, step in view.steps.items()
            if n in depended or view.node_type[n] != "pure"
        }
        if "plan_hash" in p and not isinstance(recorded, str):  # (absent: recomputed, §5)
            raise _Violation("plan", "plan_hash is present but not a string")
        if (self.created_payload or {}).get("kind") == "agent":
            raise _Violation("plan", "plan_generated in a job created as an agent job")
        forked = (self.created_payload or {}).get("forked_from")
        if isinstance(forked, dict):
            self._reuse(forked.get("reused"))

    def _reuse(self, reused: Any) -> None:
        """A fork's prefix (``job_created``'s ``forked_from``, docs/formats.md §3): nodes of the
        plan, each after its dependencies, completed here with the source's recorded outputs
        (checked against the source's record by :func:`affidavit.verify.check_fork`)."""
        if not isinstance(reused, list) or not reused:
            raise _Violation("payload", "forked_from.reused is not a list of steps")
        for step in reused:
            node_id = step.get("node_id") if isinstance(step, dict) else None
            if node_id not in self.node_type:
                raise _Violation("node_in_plan", f"the fork reuses {node_id!r}, not a plan node")
            if node_id in self.completed:
                raise _Violation("not_rerun", f"the fork reuses node {node_id!r} twice")
            missing = [dep for dep in self.deps[node_id] if dep not in self.completed]
            if missing:
                raise _Violation(
                    "dependencies_first",
                    f"node {node_id!r} reused before its dependency {missing[0]!r} completed",
                )
            self.completed.add(node_id)
            if self.node_type[node_id] == "pure":
                self._outputs[node_id] = step.get("output")

    # --- agent jobs -----------------------------------------------------------------------------

    def _agent_started(self, p: dict[str, Any]) -> None:
        if self._exec is not None:
            what = "a second agent_started" if self.agent else "agent_started in a plan job"
            raise _Violation("plan", what)
        if self._version == 1:  # reported first; the identity is still read, for the hashes
            self.violate("plan", 1, "agent_started: the log does not start with job_created")
        name, version, recorded = p.get("agent"), p.get("agent_version"), p.get("agent_hash")
        computed: str | None = None
        pinned_or_not = type(version) is str or (version is None and "agent_version" in p)
        if type(name) is str and pinned_or_not:
            try:
                computed = agent_hash(name, version)
            except AffidavitError:  # (not Unicode text)
                computed = None
        # The execution hash follows FORMATS "Agent jobs" even when the identity is broken.
        self.plan_hash = recorded if isinstance(recorded, str) else (computed or "")
        self._exec = _sha256(self.plan_hash.encode())
        for node_id, result_type in self._finished_before_plan:
            self._exec.update(f"{node_id}:{result_type}\n".encode())
        self._finished_before_plan.clear()
        if computed is None:
            raise _Violation(
                "plan", "agent_started: agent must be text, agent_version text or null"
            )
        _check_code_hash(p)
        if recorded != computed:
            raise _Violation(
                "plan", f"agent_hash {recorded!r} is not the hash of the agent's name and version"
            )
        if (self.created_payload or {}).get("kind") != "agent":
            raise _Violation("plan", "agent_started in a job not created as an agent job")
        self.agent = True
        self.has_plan = True
        forked = (self.created_payload or {}).get("forked_from")
        if isinstance(forked, dict):  # (before the budget: it counts this job's calls only)
            self._reuse_agent_steps(forked.get("reused"))
        if p.get("budget") is not None:
            # every node_finished goes through its handler from here on, for its usage
            self._known["node_finished"] = (self._known["node_finished"][0], 0)
            self.budget = BudgetFold(p["budget"])
        if p.get("stream") is not None:
            self.streams.limited(p["stream"])

    def _reuse_agent_steps(self, reused: Any) -> None:
        """An agent fork's prefix: the source's calls 0, 1, 2, ... as if called here (each
        checked as a ``step_called``, under this job's step ids), completed with the source's
        recorded results; no tool of theirs is invoked here."""
        if not isinstance(reused, list) or not reused:
            raise _Violation("payload", "forked_from.reused is not a list of steps")
        for step in reused:
            if not isinstance(step, dict) or type(step.get("seq")) is not int:
                raise _Violation("payload", "a reused agent step has no seq")
            kind = step.get("kind")
            if kind not in AGENT_KINDS:
                raise _Violation("payload", f"unknown step kind {kind!r}")
            self._step_called(
                {
                    "seq": step["seq"],
                    "node_id": step.get("node_id"),
                    "step_id": agent_step_id(self.job_id, step["seq"], kind),
                    "kind": kind,
                    "tool_name": step.get("tool_name"),
                    "args": step.get("args"),
                    "args_hash": step.get("args_hash"),
                }
            )
            self.completed.add(str(step["node_id"]))

    def _step_called(self, p: dict[str, Any]) -> None:
        if not self.agent:
            raise _Violation("plan", "step_called before agent_started (or in a plan job)")
        if self.budget is not None:
            self.budget.called(p)
        seq, kind, node_id = p.get("seq"), p.get("kind"), p.get("node_id")
        if type(seq) is not int or seq != self.next_seq:
            raise _Violation(
                "sequence", f"step_called with seq {seq!r}; the next step is {self.next_seq}"
            )
        if kind not in AGENT_KINDS:
            raise _Violation("payload", f"unknown step kind {kind!r}")
        if node_id != agent_node_id(seq):
            raise _Violation(
                "sequence", f"step {seq} is named {node_id!r}, not {agent_node_id(seq)!r}"
            )
        step = agent_step_id(self.job_id, seq, kind)
        if p.get("step_id") != step:
            raise _Violation(
                "node_in_plan", f"step id {p.get('step_id')!r} of step {node_id} is not {step!r}"
            )
        _check_code_hash(p)
        tool_name, args = p.get("tool_name"), p.get("args")
        if kind in _CALLED_KINDS and (type(tool_name) is not str or not tool_name):
            raise _Violation("payload", f"a {kind} step names no tool")
        if kind not in _CALLED_KINDS and tool_name is not None:
            raise _Violation("payload", f"a {kind} step names tool {tool_name!r}")
        if type(args) is not dict:
            raise _Violation("payload", "the step's args are not an object")
        try:
            args_jcs = canonical_of_parsed(args)
        except AffidavitError as exc:
            raise _Violation("payload", f"the step's args: {exc.message}") from None
        hashed = _sha256(args_jcs).hexdigest()[:16]
        if p.get("args_hash") != hashed:
            raise _Violation("sequence", f"step {node_id}: args_hash is not its args' hash")
        self.next_seq += 1
        self.steps[node_id] = step
        self.node_type[node_id] = kind
        self.deps[node_id] = _NO_DEPS
        if kind == "tool":
            self.tools[node_id] = tool_name
            self.agent_keys[node_id] = (
                idempotency_key_of(self.job_id, step, str(tool_name), args_jcs),
                hashed,
            )
        if kind not in _WAIT_KINDS:  # (a wait step's events all go to their handlers)
            self._fast_steps[node_id] = step

    def _finished_agent_wait(self, node_id: str, kind: str, p: dict[str, Any]) -> None:
        """A wait, approval or sleep step of an agent job completes only once its wait was
        answered, a wait or approval with the signal's payload as its output."""
        if node_id not in self.wait_payloads:
            raise _Violation(
                "sequence", f"{kind} step {node_id} finished before its wait was answered"
            )
        if kind != "sleep" and not _same_json(p.get("output"), self.wait_payloads[node_id]):
            raise _Violation(
                "sequence", f"the output of {kind} step {node_id} is not its signal's payload"
            )

    def _agent_completed(self) -> None:
        """A completed agent job finished every step it called."""
        for node_id in self.steps:
            if node_id not in self.completed and node_id not in self.failed_nodes:
                raise _Violation(
                    "after_terminal", f"job completed but step {node_id} never finished"
                )


def _check_code_hash(p: dict[str, Any]) -> None:
    """``code_sha256`` of ``agent_started`` or ``step_called``, when present, is a SHA-256 in
    hex (which code submitted the job or called the step: information, not identity)."""
    code = p.get("code_sha256")
    if "code_sha256" in p and (
        type(code) is not str or len(code) != 64 or code.strip("0123456789abcdef")
    ):
        raise _Violation("payload", f"code_sha256 {code!r} is not a SHA-256 in hex")
