"""The handlers of waits (``job_waiting``, ``wait_completed``), parks (``job_parked``,
``job_resumed``) and the job's end (``job_completed``, ``job_failed``, ``job_cancelled``)."""

from __future__ import annotations

from typing import Any

from affidavit.core.parks import DECISIONS_BY_REASON, RESUME_DECISIONS
from affidavit.verify._digest import canonical_hash_matches
from affidavit.verify._fold_state import (
    _JOIN_NODES,
    _WAIT_KINDS,
    _WAIT_TYPE,
    _instant,
    _same_json,
    _str,
)
from affidavit.verify._fold_tools import ToolEvents
from affidavit.verify._violation import _Violation


class EndEvents(ToolEvents):
    """The handlers of waits, parks and the job's end (see :mod:`affidavit.verify._fold`)."""

    def _job_waiting(self, p: dict[str, Any]) -> None:
        kinds = _WAIT_KINDS if self.agent else (*_WAIT_KINDS, "job")
        node_id = self._node(p, ("tool",) if "call" in p else kinds)  # (a call's approval)
        wait_type = _WAIT_TYPE.get(self.node_type[node_id], "approval")
        if p.get("wait_type") != wait_type:
            raise _Violation(
                "node_in_plan",
                f"node {node_id!r} is a {self.node_type[node_id]} node: it waits as "
                f"{wait_type!r}, not {p.get('wait_type')!r}",
            )
        key = _str(p, "correlation_key")
        if key in self.waits:
            raise _Violation("closing_rule", f"a second job_waiting for correlation key {key!r}")
        if wait_type == "timer" or (self.agent and p.get("wake_at") is not None):
            # a durable timer (an agent's sleep), or an agent's wait with a timeout
            self.timers[key] = (_str(p, "wake_at"), wait_type == "timer")
        self.waits[key] = node_id
        self.log_status = "waiting"
        self.approvals.waiting(p, self.steps.get(node_id))

    def _wait_completed(self, p: dict[str, Any]) -> None:
        key = _str(p, "correlation_key")
        waiting = self.waits.get(key)
        if waiting is None:
            raise _Violation("closing_rule", f"correlation key {key!r} is not waited for")
        if key in self.answered:
            raise _Violation("closing_rule", f"a second wait_completed for correlation key {key!r}")
        if p.get("node_id") != waiting:
            raise _Violation(
                "closing_rule",
                f"wait_completed names node {p.get('node_id')!r}; the wait is {waiting!r}'s",
            )
        if self.node_type.get(waiting) in _JOIN_NODES[bool(self.agent)]:
            self._child_results_match(waiting, p.get("payload"))
        timer = self.timers.get(key)
        by_timer = p.get("signalled_by") == "timer"
        if timer is not None and timer[1] and not by_timer:
            raise _Violation(
                "closing_rule",
                f"the timer {key!r} was answered by {p.get('signalled_by')!r}, not the timer",
            )
        if self.agent and by_timer:
            if timer is None:
                raise _Violation(
                    "closing_rule", f"the wait {key!r} has no timeout, yet the timer answered it"
                )
            if _instant(_str(p, "at")) < _instant(timer[0]):
                raise _Violation("closing_rule", f"the timer {key!r} fired before {timer[0]}")
            if not timer[1] and p.get("payload") is not None:
                raise _Violation(
                    "closing_rule", f"the wait {key!r} timed out but holds a signal's payload"
                )
        elif timer is not None and timer[1] and _instant(_str(p, "at")) < _instant(timer[0]):
            raise _Violation("closing_rule", f"the timer {key!r} fired before {timer[0]}")
        self.answered.add(key)
        self.log_status = "running"
        self.approvals.completed(p)
        if key in self.approvals.calls:
            return  # a tool call's approval: not the node's output
        if self.agent:
            self.wait_payloads[waiting] = p.get("payload")
        if waiting in self.sinks:
            self.signals[waiting] = p.get("payload")

    def _job_parked(self, p: dict[str, Any]) -> None:
        node_id = p.get("node_id")
        if node_id is not None:
            self._node(p, ())
        elif self._exec is None:
            raise _Violation("plan", "job_parked before plan_generated")
        key = p.get("idempotency_key")
        if p.get("reason") == "in_flight" and key is not None:
            # parked on an invocation a dead attempt left open: one of the named node's
            # (the key is optional in docs/formats.md §3; the runtime always names it)
            open_invocation = self.open_by_key.get(key) if type(key) is str else None
            if open_invocation is None or self.started[key][1] != node_id:
                shown = f"{key[:16]}…" if type(key) is str else repr(key)
                raise _Violation(
                    "closing_rule",
                    f"parked in flight on key {shown}, which is not an open invocation of "
                    f"node {node_id!r}",
                )
        self.parked = True
        self.park = p
        self.log_status = "parked"

    def _job_resumed(self, p: dict[str, Any]) -> None:
        if not self.parked:
            raise _Violation("closing_rule", "job_resumed while the job is not parked")
        if self.budget is not None:
            self.budget.resumed(p)
        decision = p.get("decision")
        reason = self.park.get("reason")
        # the decisions that resolve the park's reason; a reason the runtime does not know
        # (docs/formats.md §3 leaves the list open) takes any decision of the format
        allowed = (
            DECISIONS_BY_REASON.get(reason, RESUME_DECISIONS)
            if type(reason) is str
            else RESUME_DECISIONS
        )
        if decision not in allowed:
            raise _Violation(
                "closing_rule",
                f"decision {decision!r} does not resolve a park for {reason!r} "
                f"(one of: {', '.join(allowed)})",
            )
        result = p.get("result")
        if decision != "accept_result" and result is not None:
            raise _Violation(
                "closing_rule", f"a result goes only with accept_result, not with {decision!r}"
            )
        key = self.park.get("idempotency_key")
        if (
            decision == "accept_result"
            and type(key) is str
            and key in self.committed
            and not canonical_hash_matches(result, self.committed[key])
        ):  # (the runtime commits the accepted result in the resume's transaction)
            raise _Violation(
                "commit_evidence",
                f"the accepted result is not the result committed for key {key[:16]}…",
            )
        self.parked = False
        self.park = {}
        self.log_status = "pending"

    def _job_completed(self, p: dict[str, Any]) -> None:
        self.terminal_payload = p
        self._terminal("completed")
        if self.agent:  # (its output is the agent function's return: any JSON value)
            self._agent_completed()
            return
        if not self.completed.issuperset(self.order):
            missing = next(n for n in self.order if n not in self.completed)
            raise _Violation(
                "after_terminal", f"job completed but node {missing!r} never completed"
            )
        self._check_output(p.get("output"))

    def _check_output(self, output: Any) -> None:
        """The job output is an object mapping each sink node's id to its output (docs/formats.md
        §3): a tool node's committed result, a pure node's recorded output (its
        ``node_finished``, which :meth:`feed_all` sends to the handler for the pure sinks only),
        a wait or approval node's signal payload. (A compensated node has no output the format
        defines.)"""
        if type(output) is not dict:
            raise _Violation("after_terminal", "the job output is not an object")
        if set(output) != set(self.sinks):
            raise _Violation(
                "after_terminal",
                f"the job output has the keys {sorted(output)}, not the sink nodes "
                f"{sorted(self.sinks)}",
            )
        committed_by_node: dict[str, str] = {}
        if any(self.node_type[n] == "tool" for n in self.sinks):
            for key, result_hash in self.committed.items():
                committed_by_node[self.started[key][1]] = result_hash
        for node_id in self.sinks:
            kind = self.node_type[node_id]
            if kind == "tool":
                recorded = committed_by_node.get(node_id)
                if recorded is None:  # completed as compensated
                    continue
                if canonical_hash_matches(output[node_id], recorded):
                    continue
                what = "committed result"
            elif kind in _WAIT_KINDS and node_id in self.signals:
                if _same_json(output[node_id], self.signals[node_id]):
                    continue
                what = "signal payload"
            elif kind == "pure" and node_id in self._outputs:
                if _same_json(output[node_id], self._outputs[node_id]):
                    continue
                what = "recorded output"
            else:
                continue
            raise _Violation(
                "after_terminal", f"the job output of node {node_id!r} is not its {what}"
            )

    def _job_failed(self, p: dict[str, Any]) -> None:
        self.terminal_payload = p
        self._terminal("failed")
        if p.get("node_id") is not None:  # (optional: a job may fail outside any node)
            self._node(p, ())

    def _child_completed(self, p: dict[str, Any]) -> None:
        """A join's record of one child: the join waits for children, not answered yet, and
        names each child once (``verify --tree`` holds the child to what is recorded here)."""
        node_id = _str(p, "node_id")
        key = next((k for k, n in self.waits.items() if n == node_id), None)
        joins = _JOIN_NODES[bool(self.agent)]
        if key is None or self.node_type.get(node_id) not in joins or key in self.answered:
            raise _Violation(
                "closing_rule", f"child_completed for node {node_id!r}, which awaits no child now"
            )
        child = _str(p, "job_id")
        if any(c["job_id"] == child for c in self.children):
            raise _Violation("closing_rule", f"a second child_completed for job {child}")
        self.children.append(
            {
                "node_id": node_id,
                "job_id": child,
                "status": p.get("status"),
                "chain_head": p.get("chain_head"),
                "event_count": p.get("event_count"),
                "seal_sha256": p.get("seal_sha256"),
            }
        )

    def _child_results_match(self, node_id: str, payload: Any) -> None:
        """A join's answer is the results its child_completed events recorded, in order."""
        recorded = [(c["job_id"], c["status"]) for c in self.children if c["node_id"] == node_id]
        given = (
            [(r.get("job_id"), r.get("status")) for r in payload if isinstance(r, dict)]
            if isinstance(payload, list)
            else None
        )
        if given != recorded:
            raise _Violation(
                "closing_rule",
                f"the join {node_id!r} was answered with other children than it recorded",
            )

    def _job_cancelled(self, p: dict[str, Any]) -> None:
        self._terminal("cancelled")

    def _terminal(self, status: str) -> None:
        self.log_status = status
        self.terminal_version = self._version
        if self._exec is None:
            raise _Violation("plan", f"the job is {status} before plan_generated")
