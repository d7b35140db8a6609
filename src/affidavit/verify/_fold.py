"""One streaming pass over a job's log that computes every proof at once.

The log is read once, in version order, and never held: per event the pass updates the chain
(recomputed root and stored-hash check), the execution hash, and a small replay state — the plan,
which nodes completed, which invocations are open, which keys were committed with which result
hash. Memory grows with the plan and the number of idempotency keys, not with the log.

Invariants of the replay proof (ARCHITECTURE.md "Verification Mode"), each reported by name
with the version of the first event that violates it:

(1)  ``payload``: every payload is a JSON object with the fields its type needs;
(2)  ``plan``: ``plan_generated`` comes before any step event, its task graph is a valid plan
     and its ``plan_hash`` recomputes;
(3)  ``node_in_plan``: every step event names a node of the plan, with that node's step id;
(4)  ``dependencies_first``: a node starts and finishes only after its dependencies completed;
(5)  ``not_rerun``: a completed node is never started or finished again (replay never calls
     out);
(6)  ``commit_evidence``: every committed invocation has started + finished(success) +
     committed events, with a result hash that recomputes; a tool node finishes as
     ``side_effect_committed`` only with a committed invocation;
(7)  ``committed_once``: no key is committed twice or executed again after its commit;
(8)  ``closing_rule``: an invocation finishes once, after it started;
(9)  ``after_terminal``: nothing follows a terminal event; a completed job completed every node;
(10) ``status``: the job's stored status agrees with the log;
(11) ``ledger``: the ledger rows agree with the log (also reported by the ledger proof).
"""

from __future__ import annotations

import hashlib
import sys
from base64 import b64encode
from collections.abc import Callable
from typing import Any

import orjson

from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.core.chain import GENESIS
from affidavit.core.errors import AffidavitError
from affidavit.core.events import COMPLETED_RESULT_TYPES, EventType
from affidavit.core.plan import Plan

TERMINAL_EVENTS = {
    "job_completed": "completed",
    "job_failed": "failed",
    "job_cancelled": "cancelled",
}
RESULT_TYPES = frozenset(
    {
        "pure",
        "side_effect_committed",
        "retryable_failure",
        "permanent_failure",
        "compensatable_failure",
        "compensated",
    }
)
# Event types that belong to one step of the plan and carry node_id + step_id.
_STEP_EVENTS = frozenset(
    {
        "node_started",
        "tool_invocation_started",
        "tool_invocation_finished",
        "command_committed",
        "state_changed",
        "node_finished",
        "confirmation_warning",
        "step_compensated",
    }
)
_KNOWN_TYPES = frozenset(t.value for t in EventType)
_sha256 = hashlib.sha256


class _Violation(Exception):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(detail)
        self.invariant = invariant
        self.detail = detail


def _str(p: dict[str, Any], name: str) -> str:
    value = p.get(name)
    if type(value) is not str:
        raise _Violation("payload", f"field {name!r} is missing or not a string")
    return value


class LogFold:
    """Feed events in version order with :meth:`feed`; read the proofs afterwards."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        # chain
        self.head = GENESIS
        self.count = 0
        self.first_bad_version: int | None = None
        # execution hash
        self.plan_hash: str | None = None
        self._exec: Any = None
        self._finished_before_plan: list[tuple[str, str]] = []
        # replay state
        self.plan: Plan | None = None
        self.steps: dict[str, str] = {}
        self.completed: set[str] = set()
        self.committed_nodes: set[str] = set()
        self.invocation_ids: set[str] = set()  # every invocation started
        self.open_invocations: dict[str, str] = {}  # open invocation_id -> key
        self.open_by_key: dict[str, str] = {}  # key -> open invocation_id (insertion = log order)
        # key -> (invocation, result hash) of a success not committed yet (T2 commits it next)
        self.success: dict[str, tuple[str, str | None]] = {}
        self.committed: dict[str, str] = {}  # key -> result_hash
        self.keys: set[str] = set()
        self.log_status = "pending"
        self.terminal_version: int | None = None
        # findings
        self.replay_error: tuple[str, int | None, str] | None = None
        self.ledger_errors: list[str] = []
        self._handlers: dict[str, Callable[[dict[str, Any], int], None]] = {
            "plan_generated": self._plan_generated,
            "node_started": self._node_started,
            "tool_invocation_started": self._invocation_started,
            "tool_invocation_finished": self._invocation_finished,
            "command_committed": self._command_committed,
            "node_finished": self._node_finished,
            "job_waiting": self._job_waiting,
            "wait_completed": self._wait_completed,
            "job_parked": self._job_parked,
            "job_resumed": self._job_resumed,
        }

    # --- findings -------------------------------------------------------------------------------

    def violate(self, invariant: str, version: int | None, detail: str) -> None:
        """Record a violated invariant; only the first one is reported."""
        if self.replay_error is None:
            self.replay_error = (invariant, version, detail)

    def ledger_error(self, message: str) -> None:
        if len(self.ledger_errors) < 20:
            self.ledger_errors.append(message)

    # --- the pass -------------------------------------------------------------------------------

    def feed(
        self,
        version: int,
        event_id: str,
        event_type: str,
        payload: bytes,
        stored_hash: str | None,
    ) -> None:
        """Take the next event of the log (stored bytes, as read)."""
        self.count += 1
        head = _sha256(
            b"".join(
                (
                    self.head,
                    b"\n",
                    event_id.encode(),
                    b" ",
                    event_type.encode(),
                    b" ",
                    b64encode(payload),
                )
            )
        ).digest()
        self.head = head
        if self.first_bad_version is None and (version != self.count or stored_hash != head.hex()):
            self.first_bad_version = self.count
        if self.terminal_version is not None:
            self.violate(
                "after_terminal",
                version,
                f"{event_type} follows the terminal event at version {self.terminal_version}",
            )
        if event_type not in _KNOWN_TYPES:
            self.violate("payload", version, f"unknown event type {event_type!r}")
            return
        try:
            p = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.violate("payload", version, f"{event_type} payload is not JSON")
            return
        if type(p) is not dict:
            self.violate("payload", version, f"{event_type} payload is not a JSON object")
            return
        if event_type == "node_finished":
            self._execution_step(p)
        try:
            if event_type in _STEP_EVENTS:
                self._check_step(p, event_type)
            handler = self._handlers.get(event_type)
            if handler is not None:
                handler(p, version)
            elif event_type in TERMINAL_EVENTS:
                self._terminal(event_type, version)
        except _Violation as v:
            self.violate(v.invariant, version, f"{event_type}: {v.detail}")

    def _check_step(self, p: dict[str, Any], event_type: str) -> None:
        node_id = _str(p, "node_id")
        step_id = _str(p, "step_id")
        if self.plan is None:
            raise _Violation("plan", "a step event before plan_generated")
        expected = self.steps.get(node_id)
        if expected is None:
            raise _Violation("node_in_plan", f"node {node_id!r} is not in the plan")
        if step_id != expected:
            raise _Violation(
                "node_in_plan", f"step id {step_id!r} of node {node_id!r} is not {expected!r}"
            )

    def _deps_completed(self, node_id: str, what: str) -> None:
        assert self.plan is not None
        for dep in self.plan.by_id[node_id].depends_on:
            if dep not in self.completed:
                raise _Violation(
                    "dependencies_first",
                    f"node {node_id!r} {what} before its dependency {dep!r} completed",
                )

    # --- handlers -------------------------------------------------------------------------------

    def _execution_step(self, p: dict[str, Any]) -> None:
        """FORMATS.md §5 over every node_finished in log order, whatever else is wrong with it
        (the replay proof reports that)."""
        node_id, result_type = p.get("node_id"), p.get("result_type")
        pair = (
            node_id if isinstance(node_id, str) else "",
            result_type if isinstance(result_type, str) else "",
        )
        if self._exec is None:
            self._finished_before_plan.append(pair)
        else:
            self._exec.update(f"{pair[0]}:{pair[1]}\n".encode())

    def _plan_generated(self, p: dict[str, Any], version: int) -> None:
        if self._exec is not None:
            raise _Violation("plan", "a second plan_generated")
        graph = p.get("task_graph")
        recorded = p.get("plan_hash")
        try:
            recomputed = canonical_sha256(graph) if graph is not None else None
        except AffidavitError:
            recomputed = None
        # The execution hash follows FORMATS.md §5 even when the plan itself is broken.
        self.plan_hash = recorded if isinstance(recorded, str) else (recomputed or "")
        self._exec = _sha256(self.plan_hash.encode())
        for node_id, result_type in self._finished_before_plan:
            self._exec.update(f"{node_id}:{result_type}\n".encode())
        self._finished_before_plan.clear()
        try:
            plan = Plan.parse(graph)
        except AffidavitError as exc:
            raise _Violation("plan", f"the task graph is not a valid plan: {exc.message}") from exc
        if recorded is not None and recorded != recomputed:
            raise _Violation("plan", f"plan_hash {recorded} does not match the task graph")
        self.plan = plan
        self.steps = plan.step_ids(self.job_id)

    def _node_started(self, p: dict[str, Any], version: int) -> None:
        node_id = p["node_id"]
        if node_id in self.completed:
            raise _Violation("not_rerun", f"node {node_id!r} started again after it completed")
        self._deps_completed(node_id, "started")
        if self.log_status in ("pending", "parked", "waiting"):
            self.log_status = "running"

    def _invocation_started(self, p: dict[str, Any], version: int) -> None:
        key = sys.intern(_str(p, "idempotency_key"))  # one string per key, however often seen
        invocation = _str(p, "invocation_id")
        node_id = p["node_id"]
        assert self.plan is not None
        if self.plan.by_id[node_id].type != "tool":
            raise _Violation("node_in_plan", f"node {node_id!r} is not a tool node")
        self._deps_completed(node_id, "invoked its tool")
        if key in self.committed:
            raise _Violation("committed_once", f"key {key[:16]}… executed again after its commit")
        if invocation in self.invocation_ids:
            raise _Violation("closing_rule", f"invocation {invocation} started twice")
        if key in self.open_by_key:
            raise _Violation(
                "closing_rule",
                f"key {key[:16]}… started again while invocation {self.open_by_key[key]} is open",
            )
        self.invocation_ids.add(invocation)
        self.open_invocations[invocation] = key
        self.open_by_key[key] = invocation
        self.keys.add(key)

    def _invocation_finished(self, p: dict[str, Any], version: int) -> None:
        key = _str(p, "idempotency_key")
        invocation = _str(p, "invocation_id")
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
        if outcome not in ("success", "failure", "timeout", "lost"):
            raise _Violation("payload", f"unknown outcome {outcome!r}")
        del self.open_invocations[invocation]
        self.open_by_key.pop(key, None)
        if outcome == "success":
            try:
                result_hash: str | None = _sha256(canonical(p.get("result"))).hexdigest()
            except AffidavitError:
                result_hash = None
            self.success[key] = (invocation, result_hash)

    def _command_committed(self, p: dict[str, Any], version: int) -> None:
        key = p.get("idempotency_key")
        if key is None:
            return  # a command of a non-tool step: nothing in the ledger
        if type(key) is not str:
            raise _Violation("payload", "field 'idempotency_key' is not a string")
        command = _str(p, "command_id")
        result_hash = _str(p, "result_hash")
        if key in self.committed:
            self.ledger_error(f"key {key[:16]}… committed twice")
            raise _Violation("committed_once", f"key {key[:16]}… committed twice")
        success = self.success.pop(key, None)
        if success is None or success[0] != command:
            raise _Violation(
                "commit_evidence",
                f"command {command} of key {key[:16]}… has no successful invocation",
            )
        if success[1] != result_hash:
            raise _Violation(
                "commit_evidence",
                f"result_hash of key {key[:16]}… does not match the recorded result",
            )
        self.committed[sys.intern(key)] = result_hash
        self.committed_nodes.add(p["node_id"])

    def _node_finished(self, p: dict[str, Any], version: int) -> None:
        node_id = p["node_id"]
        result_type = p.get("result_type")
        if result_type not in RESULT_TYPES:
            raise _Violation("payload", f"unknown result_type {result_type!r}")
        if node_id in self.completed:
            raise _Violation("not_rerun", f"node {node_id!r} finished again after it completed")
        self._deps_completed(node_id, "finished")
        if result_type == "side_effect_committed":
            assert self.plan is not None
            if self.plan.by_id[node_id].type != "tool" or node_id not in self.committed_nodes:
                raise _Violation(
                    "commit_evidence",
                    f"node {node_id!r} finished as side_effect_committed without a commit",
                )
        if result_type in COMPLETED_RESULT_TYPES:
            self.completed.add(node_id)

    def _job_waiting(self, p: dict[str, Any], version: int) -> None:
        self.log_status = "waiting"

    def _wait_completed(self, p: dict[str, Any], version: int) -> None:
        self.log_status = "running"

    def _job_parked(self, p: dict[str, Any], version: int) -> None:
        self.log_status = "parked"

    def _job_resumed(self, p: dict[str, Any], version: int) -> None:
        self.log_status = "pending"

    def _terminal(self, event_type: str, version: int) -> None:
        self.log_status = TERMINAL_EVENTS[event_type]
        self.terminal_version = version
        if event_type == "job_completed" and self.plan is not None:
            missing = [n for n in self.plan.order if n not in self.completed]
            if missing:
                raise _Violation(
                    "after_terminal", f"job completed but node {missing[0]!r} never completed"
                )

    # --- results --------------------------------------------------------------------------------

    @property
    def root(self) -> str:
        return self.head.hex()

    def execution_hash(self) -> str:
        if self._exec is not None:
            return str(self._exec.hexdigest())
        digest = _sha256(b"")  # no plan_generated: the plan hash is empty
        for node_id, result_type in self._finished_before_plan:
            digest.update(f"{node_id}:{result_type}\n".encode())
        return digest.hexdigest()

    def finish(self) -> None:
        """Checks that need the whole log."""
        if self.count == 0:
            self.violate("plan", None, "the log is empty")
        elif self.plan is None:
            self.violate("plan", None, "the log has no plan_generated event")

    @property
    def pending_keys(self) -> tuple[str, ...]:
        return tuple(self.open_by_key)
