"""The handlers of a step's events: ``node_started``, the tool invocations, their commits,
``node_finished`` and compensations."""

from __future__ import annotations

import sys
from typing import Any

from affidavit.core.events import COMPLETED_RESULT_TYPES, RESULT_TYPES
from affidavit.verify._digest import canonical_hash_matches
from affidavit.verify._fold_plan import PlanEvents
from affidavit.verify._fold_state import (
    _OUTCOMES,
    _TOOL_ONLY,
    _WAIT_KINDS,
    _str,
    _uncommitted,
)
from affidavit.verify._violation import _Violation


class ToolEvents(PlanEvents):
    """The handlers of a step's events (see :mod:`affidavit.verify._fold`)."""

    def _node_started(self, p: dict[str, Any]) -> None:
        node_id = p["node_id"]
        expected = self.steps.get(node_id)
        if expected is None or expected != p.get("step_id"):
            self._step(p)
        if node_id in self.completed:
            raise _Violation("not_rerun", f"node {node_id!r} started again after it completed")
        self._deps_completed(node_id, "started")
        if self.log_status in ("pending", "parked", "waiting"):
            self.log_status = "running"

    # The ledger proof reads what the log records — which invocations started, finished and
    # were committed — whatever the replay proof says about the events that record it. So the
    # three handlers below keep that record also for an event that breaks an invariant (only
    # the first broken one is reported, so nothing later in the replay proof depends on it):
    # one broken invariant must not make the ledger proof report starts, finishes or commits
    # the log does hold as missing ("finished without being started").

    def _invocation_started(self, p: dict[str, Any]) -> None:
        try:
            self._check_invocation_started(p)
            if "requires_approval" in p:
                self.approvals.invocation(p)
            if "limit_grant" in p:
                self.limits.started(p, self._version)
        except _Violation:
            key, invocation = p.get("idempotency_key"), p.get("invocation_id")
            if type(key) is str and type(invocation) is str:
                self._start(invocation, key, p.get("node_id"), p.get("tool_name"), p)
            raise

    def _start(self, invocation: str, key: str, node_id: Any, tool_name: Any, p: Any) -> None:
        self.invocation_ids.add(invocation)
        self.open_invocations[invocation] = key
        self.open_by_key[key] = invocation
        self.started[key] = (
            invocation,
            node_id,
            tool_name,
            p.get("args_hash"),
            p.get("step_id"),
        )

    def _check_invocation_started(self, p: dict[str, Any]) -> None:
        node_id = p["node_id"]
        expected = self.steps.get(node_id)
        if expected is None or expected != p.get("step_id"):
            self._step(p)
        key = sys.intern(p["idempotency_key"])  # one string per key, however often seen
        invocation = p["invocation_id"]
        if self.node_type[node_id] != "tool":
            raise _Violation("node_in_plan", f"node {node_id!r} is not a tool node")
        tool_name = p.get("tool_name")
        if tool_name != self.tools[node_id]:
            raise _Violation(
                "node_in_plan",
                f"node {node_id!r} invoked tool {tool_name!r}; its tool is {self.tools[node_id]!r}",
            )
        implied = self.agent_keys.get(node_id)
        if implied is not None and implied != (key, p.get("args_hash")):
            raise _Violation(
                "sequence",
                f"step {node_id} invoked key {key[:16]}… with args_hash {p.get('args_hash')!r}; "
                f"its step_called implies key {implied[0][:16]}… and {implied[1]!r}",
            )
        if key in self.committed:
            self.ledger_error(f"key {key[:16]}… executed again after its commit")
            raise _Violation("committed_once", f"key {key[:16]}… executed again after its commit")
        uncommitted = self.success.get(key)
        if uncommitted is not None:
            raise _Violation(
                "commit_evidence",
                _uncommitted(uncommitted, "the key is started again, never committed"),
            )
        if node_id in self.completed:
            raise _Violation(
                "not_rerun", f"node {node_id!r} invoked its tool again after it completed"
            )
        self._deps_completed(node_id, "invoked its tool")
        prior = self.started.get(key)
        if prior is not None and prior[1] != node_id:
            raise _Violation(
                "closing_rule", f"key {key[:16]}… was invoked by node {prior[1]!r} before"
            )
        if prior is not None and prior[3] != p.get("args_hash"):  # (the key hashes the args)
            raise _Violation(
                "closing_rule",
                f"key {key[:16]}… started again with args_hash {p.get('args_hash')!r}, "
                f"not {prior[3]!r}",
            )
        if invocation in self.invocation_ids:
            self.ledger_error(f"invocation {invocation} (key {key[:16]}…) started twice")
            raise _Violation("closing_rule", f"invocation {invocation} started twice")
        if key in self.open_by_key:
            raise _Violation(
                "closing_rule",
                f"key {key[:16]}… started again while invocation {self.open_by_key[key]} is open",
            )
        if self.timed_out.pop(key, True) is False:
            raise _Violation(
                "closing_rule",
                f"key {key[:16]}… started again after a timeout, though its tool is not "
                "declared idempotent: a blind retry of a call that may have acted",
            )
        if "timeout_seconds" in p or "idempotent" in p:
            self.timed[invocation] = (p.get("timeout_seconds"), p.get("idempotent") is True)
        self._start(invocation, key, node_id, tool_name, p)

    def _invocation_finished(self, p: dict[str, Any]) -> None:
        if p.get("invocation_id") in self.limits.open:
            self.limits.finished(p)
        try:
            self._check_invocation_finished(p)
        except _Violation:
            invocation = p.get("invocation_id")
            if isinstance(invocation, str) and invocation in self.open_invocations:
                # an open invocation: it is closed, as the log says
                self._close(invocation, self.open_invocations[invocation], p)
            raise

    def _close(self, invocation: str, key: str, p: dict[str, Any]) -> None:
        del self.open_invocations[invocation]
        if self.open_by_key.get(key) == invocation:
            del self.open_by_key[key]
        self._unknown(key, p.get("outcome"))
        if p.get("outcome") == "success":
            self.success[key] = (invocation, p.get("result"), key, self._version)

    def _check_invocation_finished(self, p: dict[str, Any]) -> None:
        node_id = p["node_id"]
        expected = self.steps.get(node_id)
        if expected is None or expected != p.get("step_id"):
            self._step(p)
        key = p["idempotency_key"]
        invocation = p["invocation_id"]
        outcome = p.get("outcome")
        started_key = self.open_invocations.get(invocation)
        if started_key is None:
            if invocation in self.invocation_ids:
                self.ledger_error(f"invocation {invocation} (key {key[:16]}…) finished twice")
                raise _Violation("closing_rule", f"invocation {invocation} finished twice")
            self.ledger_error(f"invocation {invocation} finished without being started")
            raise _Violation("closing_rule", f"invocation {invocation} finished, never started")
        if started_key != key:
            raise _Violation("closing_rule", f"invocation {invocation} finished under another key")
        started_by = self.started[started_key][1]
        if started_by != node_id:
            raise _Violation(
                "closing_rule",
                f"invocation {invocation} finished under node {node_id!r}; "
                f"node {started_by!r} started it",
            )
        if outcome not in _OUTCOMES:
            raise _Violation("payload", f"unknown outcome {outcome!r}")
        self._check_timed_out(invocation, key, p)
        self._close(invocation, started_key, p)

    def _check_timed_out(self, invocation: str, key: str, p: dict[str, Any]) -> None:
        """A closing of a call past its time limit agrees with the call's start (its
        ``timeout_seconds``), and its ``resolution`` with its outcome; a key closed as
        ``timeout`` may start again only if its start declared the tool idempotent."""
        timeout, idempotent = self.timed.pop(invocation, (None, False))
        outcome, resolution = p.get("outcome"), p.get("resolution")
        if "timeout_seconds" in p and (timeout is None or p["timeout_seconds"] != timeout):
            raise _Violation(
                "closing_rule",
                f"invocation {invocation} closed as timed out after {p['timeout_seconds']!r}s; "
                f"it started with the time limit {timeout!r}",
            )
        fits = {None: True, "retry": outcome == "timeout" and idempotent}
        fits["reconcile"] = outcome in ("success", "lost") and p.get("catch_up") is True
        if (
            resolution not in fits
            or not fits[resolution]
            or (resolution is not None and "timeout_seconds" not in p)
        ):
            raise _Violation(
                "closing_rule",
                f"invocation {invocation} closed with resolution {resolution!r} and outcome "
                f"{outcome!r}, which do not fit",
            )
        if outcome == "timeout":
            self.timed_out[key] = idempotent

    def _command_committed(self, p: dict[str, Any]) -> None:
        try:
            self._check_command_committed(p)
        except _Violation as v:
            key, node_id = p.get("idempotency_key"), p.get("node_id")
            if type(key) is str and key not in self.committed and "result_hash" in p:
                self.success.pop(key, None)
                self._commit(key, p["result_hash"], node_id)
            raise v

    def _commit(self, key: str, result_hash: Any, node_id: Any) -> None:
        self.committed[key] = result_hash
        if type(node_id) is str:
            self.committed_nodes.add(node_id)

    def _check_command_committed(self, p: dict[str, Any]) -> None:
        node_id = p["node_id"]
        expected = self.steps.get(node_id)
        if expected is None or expected != p.get("step_id"):
            self._step(p)
        if self.node_type[node_id] != "tool":
            raise _Violation("node_in_plan", f"node {node_id!r} is not a tool node")
        key = _str(p, "idempotency_key")
        command = p["command_id"]
        result_hash = p["result_hash"]
        if key in self.committed:
            self.ledger_error(f"key {key[:16]}… committed twice")
            raise _Violation("committed_once", f"key {key[:16]}… committed twice")
        success = self.success.pop(key, None)
        if success is None or success[0] != command:
            raise _Violation(
                "commit_evidence",
                f"command {command} of key {key[:16]}… has no successful invocation",
            )
        if self.started[key][1] != node_id:
            raise _Violation(
                "commit_evidence",
                f"command {command} names node {node_id!r}; "
                f"node {self.started[key][1]!r} invoked key {key[:16]}…",
            )
        if not canonical_hash_matches(success[1], result_hash):
            raise _Violation(
                "commit_evidence",
                f"result_hash of key {key[:16]}… does not match the recorded result",
            )
        self._commit(success[2], result_hash, node_id)  # the key as first seen

    def _node_finished(self, p: dict[str, Any]) -> None:
        if self.budget is not None:
            self.budget.finished(p)
        if "limit_grant" in p:
            self.limits.step_finished(p, self._version)
        # docs/formats.md §5 over every node_finished in log order, whatever else is wrong with it
        # (the replay proof reports that).
        node_id: Any = p.get("node_id")
        result_type = p.get("result_type")
        pair = (
            node_id if type(node_id) is str else "",
            result_type if type(result_type) is str else "",
        )
        if self._exec is None:
            self._finished_before_plan.append(pair)
        else:
            self._exec.update(f"{pair[0]}:{pair[1]}\n".encode())
        expected = self.steps.get(node_id)
        if expected is None or expected != p.get("step_id"):
            self._step(p)
        if result_type not in RESULT_TYPES:
            raise _Violation("payload", f"unknown result_type {result_type!r}")
        if node_id in self.completed:
            raise _Violation("not_rerun", f"node {node_id!r} finished again after it completed")
        self._deps_completed(node_id, "finished")
        kind = self.node_type[node_id]
        if result_type == "side_effect_committed" and (
            kind != "tool" or node_id not in self.committed_nodes
        ):
            raise _Violation(
                "commit_evidence",
                f"node {node_id!r} finished as side_effect_committed without a commit",
            )
        if result_type == "pure" and kind == "tool":  # (it would complete without a commit)
            raise _Violation(
                "commit_evidence",
                f"tool node {node_id!r} finished as pure: a tool node completes only as "
                "side_effect_committed or compensated",
            )
        if result_type in _TOOL_ONLY and kind != "tool":
            raise _Violation(
                "node_in_plan",
                f"node {node_id!r} is a {kind} node, which does not finish as {result_type}",
            )
        if result_type == "compensatable_failure":
            self.compensatable.add(node_id)
        elif result_type == "compensated" and node_id not in self.compensations:
            raise _Violation(
                "commit_evidence",
                f"node {node_id!r} finished as compensated without a step_compensated",
            )
        if self.agent and kind in _WAIT_KINDS and result_type in COMPLETED_RESULT_TYPES:
            self._finished_agent_wait(node_id, kind, p)
        if result_type in COMPLETED_RESULT_TYPES:
            self.completed.add(node_id)
            self.committed_nodes.discard(node_id)
            self.compensations.discard(node_id)
            if node_id not in self._fast_steps and kind == "pure":  # a pure sink
                self._outputs[node_id] = p.get("output")
        else:
            self.failed_nodes.add(node_id)

    def _step_compensated(self, p: dict[str, Any]) -> None:
        node_id = self._tool_step(p)
        if node_id not in self.compensatable:
            raise _Violation(
                "commit_evidence",
                f"step_compensated for node {node_id!r}, which has no compensatable_failure",
            )
        self.compensatable.discard(node_id)
        self.compensations.add(node_id)
