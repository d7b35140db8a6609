"""One streaming pass over a job's log that computes every proof at once.

The log is read once, in version order, and never held: per event the pass updates the chain
(recomputed root and stored-hash check), the execution hash, and a small replay state — the plan,
which nodes completed, which invocations are open, which keys were committed with which result
hash. Memory grows with the plan and the number of idempotency keys, not with the log.

Invariants of the replay proof (ARCHITECTURE.md "Verification Mode"), each reported by name
with the version of the first event that violates it:

(1)  ``payload``: every payload is a JSON object with the fields its type needs;
(2)  ``plan``: ``plan_generated`` comes before any step event, its task graph is a DAG of
     uniquely named, typed nodes (see :mod:`affidavit.verify._plan`) and its ``plan_hash``
     recomputes;
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

import binascii
import hashlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from affidavit.core.canonical import canonical_sha256
from affidavit.core.chain import GENESIS
from affidavit.core.errors import AffidavitError
from affidavit.core.events import COMPLETED_RESULT_TYPES, RESULT_TYPES, EventType
from affidavit.verify._digest import canonical_hash_matches
from affidavit.verify._plan import PlanProblem, PlanView, read_plan

_KNOWN_TYPES = frozenset(t.value for t in EventType)
_OUTCOMES = frozenset({"success", "failure", "timeout", "lost"})
_NOT_RUNNING = ("pending", "parked", "waiting")
_sha256 = hashlib.sha256
# ``" type "`` as it enters the chain hash, for every known type
_SEPARATORS = {t: b" " + t.encode() + b" " for t in _KNOWN_TYPES}
# The event types with a fast path in LogFold.feed_all, and a sentinel equal to no step id.
_NODE_STARTED, _INVOCATION_STARTED, _INVOCATION_FINISHED, _COMMAND_COMMITTED, _NODE_FINISHED = (
    1,
    2,
    3,
    4,
    5,
)
_FAST_KINDS = {
    "node_started": _NODE_STARTED,
    "tool_invocation_started": _INVOCATION_STARTED,
    "tool_invocation_finished": _INVOCATION_FINISHED,
    "command_committed": _COMMAND_COMMITTED,
    "node_finished": _NODE_FINISHED,
}
_NOWHERE = object()


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
    """Feed events in version order with :meth:`feed`; read the proofs afterwards.

    ``fast_paths=False`` sends every event through its handler (the reference the fast paths
    are tested against); the results are the same either way.
    """

    def __init__(self, job_id: str, *, fast_paths: bool = True) -> None:
        self.job_id = job_id
        # event type -> (its part of the chain hash input, its fast path or 0)
        self._known = {
            t: (_SEPARATORS[t], _FAST_KINDS.get(t, 0) if fast_paths else 0) for t in _KNOWN_TYPES
        }
        # chain
        self.head = GENESIS
        self.count = 0
        self.first_bad_version: int | None = None
        # execution hash
        self.plan_hash: str | None = None
        self._exec: Any = None
        self._finished_before_plan: list[tuple[str, str]] = []
        # the plan, reduced to what the checks need (the parsed task graph is not kept)
        self.has_plan = False
        self.steps: dict[str, str] = {}
        self.node_type: dict[str, str] = {}
        self.deps: dict[str, list[str]] = {}
        self.order: tuple[str, ...] = ()
        # replay state
        self.completed: set[str] = set()
        self.committed_nodes: set[str] = set()  # committed, node_finished not seen yet
        self.invocation_ids: set[str] = set()  # every invocation started
        self.open_invocations: dict[str, str] = {}  # open invocation_id -> key
        self.open_by_key: dict[str, str] = {}  # key -> open invocation_id (insertion = log order)
        # key -> (invocation, result) of a success not committed yet (T2 commits it next)
        # (the key itself rides along: the commit files the result hash under that same string)
        self.success: dict[str, tuple[Any, Any, str]] = {}
        self.committed: dict[str, str] = {}  # key -> result_hash
        self.keys: set[str] = set()
        self.log_status = "pending"
        self.terminal_version: int | None = None
        # findings
        self.replay_error: tuple[str, int | None, str] | None = None
        self.ledger_errors: list[str] = []
        noop = self._noop
        self._dispatch: dict[str, Callable[[dict[str, Any]], object]] = {
            "job_created": noop,
            "plan_generated": self._plan_generated,
            "node_started": self._node_started,
            "tool_invocation_started": self._invocation_started,
            "tool_invocation_finished": self._invocation_finished,
            "command_committed": self._command_committed,
            "state_changed": self._step,
            "node_finished": self._node_finished,
            "job_waiting": self._job_waiting,
            "wait_completed": self._wait_completed,
            "job_parked": self._job_parked,
            "job_resumed": self._job_resumed,
            "confirmation_warning": self._step,
            "step_compensated": self._step,
            "job_completed": self._job_completed,
            "job_failed": self._job_failed,
            "job_cancelled": self._job_cancelled,
        }
        assert set(self._dispatch) == _KNOWN_TYPES
        self._version = 0

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
        self.feed_all(((version, event_id, event_type, payload, stored_hash),))

    def feed_all(
        self,
        rows: Iterable[tuple[int, str, str, bytes, str | None]],
        parsed: Iterable[Any] | None = None,
    ) -> None:
        """Take the next events: ``(version, event_id, type, payload bytes, stored hash)`` in
        version order. The hot loop of verification; state lives in locals while it runs.

        ``parsed``, when given, holds each row's payload already parsed — exactly what
        ``orjson.loads`` returns for its bytes (see
        :func:`~affidavit.core.canonical.canonical_parsed_exact`) — and spares parsing it again.

        The five step event types that make up nearly every log have a fast path here: the
        accepting case of their handler — the same lookups and the same state changes, with the
        changes made only once every check passed. Whatever the fast path does not accept
        (a check fails, a field is missing or of an odd type, anything raises) goes to the
        handler, which checks the event from the start and says what is wrong; so the fast path
        decides nothing the handler would decide otherwise (``tests/verify/test_fast_path.py``
        compares the two on mutated logs)."""
        head, count, first_bad = self.head, self.count, self.first_bad_version
        dispatch, violate, loads, sha256, b2a, join = (
            self._dispatch,
            self.violate,
            orjson.loads,
            _sha256,
            binascii.b2a_base64,
            b"".join,
        )
        known = self._known
        # state the handlers mutate in place (never rebound)
        completed, committed, committed_nodes = self.completed, self.committed, self.committed_nodes
        invocation_ids, keys, success = self.invocation_ids, self.keys, self.success
        open_invocations, open_by_key = self.open_invocations, self.open_by_key
        dumps, sort_keys = orjson.dumps, orjson.OPT_SORT_KEYS
        outcomes, result_types, completing = _OUTCOMES, RESULT_TYPES, COMPLETED_RESULT_TYPES
        # state a handler may rebind (plan_generated, a terminal event): re-read after each call
        steps, node_type, deps = self.steps, self.node_type, self.deps
        terminal, exec_update = self.terminal_version, self._exec_update()
        take = iter(parsed).__next__ if parsed is not None else None
        try:
            for version, event_id, event_type, payload, stored_hash in rows:
                given = take() if take is not None else None
                count += 1
                entry = known.get(event_type)
                if entry is None:  # an unknown type (reported below) is chained all the same
                    separator, kind = b" " + event_type.encode() + b" ", -1
                else:
                    separator, kind = entry
                head = sha256(
                    join((head, b"\n", event_id.encode(), separator, b2a(payload, newline=False)))
                ).digest()
                if first_bad is None and (version != count or stored_hash != head.hex()):
                    first_bad = count
                if terminal is not None:
                    violate(
                        "after_terminal",
                        version,
                        f"{event_type} follows the terminal event at version {terminal}",
                    )
                if kind < 0:
                    violate("payload", version, f"unknown event type {event_type!r}")
                    continue
                try:
                    p = loads(payload) if given is None else given
                    if kind:  # (a payload that is not an object raises here: see below)
                        try:
                            node_id = p["node_id"]
                            if steps.get(node_id, _NOWHERE) != p.get("step_id"):
                                pass  # not this node's step id: the handler says which
                            elif kind == _NODE_STARTED:
                                if node_id not in completed and completed.issuperset(deps[node_id]):
                                    if self.log_status in _NOT_RUNNING:
                                        self.log_status = "running"
                                    continue
                            elif kind == _INVOCATION_STARTED:
                                key = p["idempotency_key"]
                                invocation = p["invocation_id"]
                                if (
                                    type(key) is str
                                    and node_type[node_id] == "tool"
                                    and completed.issuperset(deps[node_id])
                                    and key not in committed
                                    and invocation not in invocation_ids
                                    and key not in open_by_key
                                ):
                                    invocation_ids.add(invocation)
                                    open_invocations[invocation] = key
                                    open_by_key[key] = invocation
                                    keys.add(key)
                                    continue
                            elif kind == _INVOCATION_FINISHED:
                                invocation = p["invocation_id"]
                                started_key = open_invocations.get(invocation)
                                outcome = p.get("outcome")
                                if (
                                    started_key is not None
                                    and started_key == p["idempotency_key"]
                                    and outcome in outcomes
                                ):
                                    del open_invocations[invocation]
                                    del open_by_key[started_key]
                                    if outcome == "success":
                                        success[started_key] = (
                                            invocation,
                                            p.get("result"),
                                            started_key,
                                        )
                                    continue
                            elif kind == _COMMAND_COMMITTED:
                                commit_key = p.get("idempotency_key")
                                if commit_key is None:
                                    continue  # a command of a non-tool step
                                command, result_hash = p["command_id"], p["result_hash"]
                                evidence = (
                                    success.get(commit_key) if commit_key not in committed else None
                                )
                                if (
                                    evidence is not None
                                    and evidence[0] == command
                                    and sha256(dumps(evidence[1], option=sort_keys)).hexdigest()
                                    == result_hash
                                ):
                                    del success[commit_key]
                                    committed[evidence[2]] = result_hash
                                    committed_nodes.add(node_id)
                                    continue
                            else:  # node_finished
                                result_type = p.get("result_type")
                                if (
                                    exec_update is not None
                                    and result_type in result_types
                                    and node_id not in completed
                                    and completed.issuperset(deps[node_id])
                                    and (
                                        result_type != "side_effect_committed"
                                        or (
                                            node_type[node_id] == "tool"
                                            and node_id in committed_nodes
                                        )
                                    )
                                ):
                                    exec_update(f"{node_id}:{result_type}\n".encode())
                                    if result_type in completing:
                                        completed.add(node_id)
                                        committed_nodes.discard(node_id)
                                    continue
                        except Exception:  # the handler checks the event again and reports it
                            pass
                    if type(p) is not dict:
                        raise _Violation("payload", "the payload is not a JSON object")
                    self._version = version
                    dispatch[event_type](p)
                except _Violation as v:
                    violate(v.invariant, version, f"{event_type}: {v.detail}")
                except orjson.JSONDecodeError:
                    violate("payload", version, f"{event_type}: the payload is not JSON")
                except (KeyError, TypeError, AttributeError) as exc:
                    violate("payload", version, f"{event_type}: malformed field ({exc!r})")
                steps, node_type, deps = self.steps, self.node_type, self.deps
                terminal, exec_update = self.terminal_version, self._exec_update()
        finally:
            self.head, self.count, self.first_bad_version = head, count, first_bad

    def _exec_update(self) -> Callable[[bytes], None] | None:
        return self._exec.update if self._exec is not None else None

    def _step(self, p: dict[str, Any]) -> str:
        """Check a step event's node and step id; return the node id."""
        node_id: Any = p.get("node_id")
        expected = self.steps.get(node_id) if type(node_id) is str else None
        if expected is not None and p.get("step_id") == expected:
            return str(node_id)
        _str(p, "node_id")
        step_id = _str(p, "step_id")
        if not self.has_plan:
            raise _Violation("plan", "a step event before plan_generated")
        if expected is None:
            raise _Violation("node_in_plan", f"node {node_id!r} is not in the plan")
        raise _Violation(
            "node_in_plan", f"step id {step_id!r} of node {node_id!r} is not {expected!r}"
        )

    def _deps_completed(self, node_id: str, what: str) -> None:
        completed = self.completed
        for dep in self.deps[node_id]:
            if dep not in completed:
                raise _Violation(
                    "dependencies_first",
                    f"node {node_id!r} {what} before its dependency {dep!r} completed",
                )

    # --- handlers -------------------------------------------------------------------------------

    def _noop(self, p: dict[str, Any]) -> None:
        pass

    def _plan_generated(self, p: dict[str, Any]) -> None:
        if self._exec is not None:
            raise _Violation("plan", "a second plan_generated")
        graph = p.get("task_graph")
        recorded = p.get("plan_hash")
        view: PlanView | None = None
        problem = "no task graph"
        try:
            view = read_plan(graph, recorded, self.job_id)
        except PlanProblem as exc:
            problem = str(exc)
        # The execution hash follows FORMATS.md §5 even when the plan itself is broken.
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

    def _invocation_started(self, p: dict[str, Any]) -> None:
        node_id = p["node_id"]
        expected = self.steps.get(node_id)
        if expected is None or expected != p.get("step_id"):
            self._step(p)
        key = sys.intern(p["idempotency_key"])  # one string per key, however often seen
        invocation = p["invocation_id"]
        if self.node_type[node_id] != "tool":
            raise _Violation("node_in_plan", f"node {node_id!r} is not a tool node")
        self._deps_completed(node_id, "invoked its tool")
        if key in self.committed:
            self.ledger_error(f"key {key[:16]}… executed again after its commit")
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

    def _invocation_finished(self, p: dict[str, Any]) -> None:
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
        if outcome not in _OUTCOMES:
            raise _Violation("payload", f"unknown outcome {outcome!r}")
        del self.open_invocations[invocation]
        del self.open_by_key[started_key]
        if outcome == "success":
            self.success[started_key] = (invocation, p.get("result"), started_key)

    def _command_committed(self, p: dict[str, Any]) -> None:
        node_id = p["node_id"]
        expected = self.steps.get(node_id)
        if expected is None or expected != p.get("step_id"):
            self._step(p)
        key = p.get("idempotency_key")
        if key is None:
            return  # a command of a non-tool step: nothing in the ledger
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
        if not canonical_hash_matches(success[1], result_hash):
            raise _Violation(
                "commit_evidence",
                f"result_hash of key {key[:16]}… does not match the recorded result",
            )
        self.committed[success[2]] = result_hash  # the key as first seen
        self.committed_nodes.add(node_id)

    def _node_finished(self, p: dict[str, Any]) -> None:
        # FORMATS.md §5 over every node_finished in log order, whatever else is wrong with it
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
        if result_type == "side_effect_committed" and (
            self.node_type[node_id] != "tool" or node_id not in self.committed_nodes
        ):
            raise _Violation(
                "commit_evidence",
                f"node {node_id!r} finished as side_effect_committed without a commit",
            )
        if result_type in COMPLETED_RESULT_TYPES:
            self.completed.add(node_id)
            self.committed_nodes.discard(node_id)

    def _job_waiting(self, p: dict[str, Any]) -> None:
        self.log_status = "waiting"

    def _wait_completed(self, p: dict[str, Any]) -> None:
        self.log_status = "running"

    def _job_parked(self, p: dict[str, Any]) -> None:
        self.log_status = "parked"

    def _job_resumed(self, p: dict[str, Any]) -> None:
        self.log_status = "pending"

    def _job_completed(self, p: dict[str, Any]) -> None:
        self._terminal("completed")
        if self.completed.issuperset(self.order):
            return
        missing = next(n for n in self.order if n not in self.completed)
        raise _Violation("after_terminal", f"job completed but node {missing!r} never completed")

    def _job_failed(self, p: dict[str, Any]) -> None:
        self._terminal("failed")

    def _job_cancelled(self, p: dict[str, Any]) -> None:
        self._terminal("cancelled")

    def _terminal(self, status: str) -> None:
        self.log_status = status
        self.terminal_version = self._version

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
        elif not self.has_plan:
            self.violate("plan", None, "the log has no plan_generated event")

    @property
    def pending_keys(self) -> tuple[str, ...]:
        return tuple(self.open_by_key)
