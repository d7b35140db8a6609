"""One streaming pass over a job's log that computes every proof at once.

The log is read once, in version order, and never held: per event the pass updates the chain
(recomputed root and stored-hash check), the execution hash, and a small replay state — the plan,
which nodes completed, which invocations are open, which keys were committed with which result
hash. Memory grows with the plan and the number of idempotency keys, not with the log.

Invariants of the replay proof (ARCHITECTURE.md "Verification Mode"), each reported by name
with the version of the first event that violates it:

(1)  ``payload``: every event is well formed: its row holds text where the format has text
     and bytes where it has bytes, it belongs to the job, its type is known, and its payload is
     a JSON object (nested no deeper than a canonical encoder can walk) with the fields its
     type needs;
(2)  ``plan``: the log opens with ``job_created`` (and has only that one);
     ``plan_generated`` comes once, before any other event but ``job_created``; its task graph
     is a DAG of uniquely named, typed nodes (see :mod:`affidavit.verify._plan`) and its
     ``plan_hash``, a string unless absent, recomputes;
(3)  ``node_in_plan``: every step event names a node of the plan, with that node's step id;
     tool invocations, commits, state changes, confirmation warnings and compensations belong
     to tool nodes, waits to wait and approval nodes (a ``job_waiting``'s ``wait_type`` is
     ``approval`` for an approval node, ``signal`` for a wait node); a node invokes the tool
     its plan names; a ``job_parked`` or ``job_failed`` that names a node names one of the plan;
(4)  ``dependencies_first``: a node starts, invokes its tool and finishes only after its
     dependencies completed;
(5)  ``not_rerun``: a completed node is never started, invoked or finished again (replay never
     calls out);
(6)  ``commit_evidence``: every committed invocation has started + finished(success) +
     committed events, all naming its node, with a result hash that recomputes; every success
     is committed (the runtime writes the two together) before its key starts again or the
     log ends; the result an ``accept_result`` resumption gives is the one committed for the
     park's key; a tool node finishes as ``side_effect_committed`` only with a committed
     invocation, never as ``pure``, and as ``compensated`` only after a ``step_compensated``
     that follows its ``compensatable_failure`` (result types of tool nodes only: on another
     node, (3) fails);
(7)  ``committed_once``: no key is committed twice or executed again after its commit;
(8)  ``closing_rule``: whatever closes closes something open, once: an invocation finishes
     once, after it started, under the node and key it started with (and a key is invoked by
     one node only, every time with the same ``args_hash``: the key hashes the arguments); a
     ``wait_completed`` answers the ``job_waiting`` of its correlation key, once, naming its
     node; a ``job_resumed`` follows a ``job_parked``, with a decision that resolves the
     park's reason (``DECISIONS_BY_REASON``; any of the format's for a reason the runtime does
     not know) and a ``result`` only with ``accept_result``; a park ``in_flight`` that names a
     key names an open invocation of its node;
(9)  ``after_terminal``: nothing follows a terminal event; a completed job completed every node,
     and its output maps exactly the plan's sink nodes to their outputs: a tool node's
     committed result, a pure node's recorded output, a wait or approval node's signal
     payload (a compensated node's is not compared);
(10) ``status``: the job row agrees with the log: its status, its namespace, plan name,
     submitter and idempotency key (those of ``job_created``), its output (of a completed job)
     and error (of a failed one), which no other job has;
(11) ``ledger``: the ledger rows agree with the log (also reported by the ledger proof).

An agent job (``job_created`` with ``"kind": "agent"``) has no plan: ``agent_started`` takes
``plan_generated``'s place (its ``agent_hash`` recomputes from the agent's name and version and
enters the execution hash in place of the plan hash), and each ``step_called`` adds one node —
``#seq`` of the recorded kind, with no dependencies, its step id recomputed (FORMATS "Agent
jobs") — before any event of that node. On top of the invariants above:

(12) ``sequence``: the steps are numbered 0, 1, 2, … in log order, without gaps or repeats,
     each named ``#seq``; a step's ``args_hash`` is its arguments' and a tool step names a
     tool; a tool step invokes its tool with the idempotency key and ``args_hash`` its
     ``step_called`` implies (so a recorded call cannot be altered without its invocations);
     a wait, approval or sleep step finishes only after its wait was answered (a sleep by
     ``signalled_by: "timer"``, not before its ``wake_at``), a wait or approval with the
     signal's payload as its output; a completed job finished every step it called (a step
     whose failure the agent caught finished as a failure).
"""

from __future__ import annotations

import binascii
import hashlib
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import orjson

from affidavit.core.agent_steps import AGENT_KINDS, agent_hash, agent_node_id, agent_step_id
from affidavit.core.canonical import canonical_of_parsed, canonical_sha256
from affidavit.core.chain import GENESIS
from affidavit.core.errors import AffidavitError
from affidavit.core.events import COMPLETED_RESULT_TYPES, RESULT_TYPES, EventType
from affidavit.core.parks import DECISIONS_BY_REASON, RESUME_DECISIONS
from affidavit.core.plan import idempotency_key_of
from affidavit.verify._approvals import INVARIANT as APPROVAL
from affidavit.verify._approvals import ApprovalFold
from affidavit.verify._budget import BudgetFold
from affidavit.verify._digest import canonical_hash_matches
from affidavit.verify._limits import INVARIANT as LIMIT
from affidavit.verify._limits import LimitFold
from affidavit.verify._plan import PlanProblem, PlanView, read_plan
from affidavit.verify._violation import _Violation

# (the events of agent jobs, agent_started and step_called, are not folded here yet: a log
# holding them is reported as an unknown event type)
_KNOWN_TYPES = frozenset(t.value for t in EventType)
_OUTCOMES = frozenset({"success", "failure", "timeout", "lost", "unknown"})
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
_NO_START = (None, None, None, None, None)  # what a key not started yet was started with
_WAIT_KINDS = ("wait", "approval", "sleep")  # (sleep: an agent's durable timer)
# the wait_type of a job_waiting, by the type of the node that waits (FORMATS.md §3)
_WAIT_TYPE = {"wait": "signal", "approval": "approval", "sleep": "timer"}
_NO_DEPS: list[str] = []  # an agent step's dependencies (never mutated)
_CALLED_KINDS = ("tool", "pure")  # the agent step kinds that name a tool
# the result types a node of any type may finish with; the others are a tool node's
# (side_effect_committed, compensatable_failure, compensated) or another node's (pure)
_ANY_NODE_FAILS = frozenset({"retryable_failure", "permanent_failure"})
_TOOL_ONLY = frozenset({"side_effect_committed", "compensatable_failure", "compensated"})


def _uncommitted(success: tuple[Any, Any, str, int], then: str) -> str:
    """A success without its commit (the runtime writes the two in one transaction)."""
    invocation, _, key, version = success
    return f"invocation {invocation} of key {key[:16]}… succeeded at version {version}; {then}"


def _same_json(a: Any, b: Any) -> bool:
    """Whether two parsed JSON values have the same canonical form (JCS)."""
    try:
        if orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            b, option=orjson.OPT_SORT_KEYS
        ):
            return True
    except (orjson.JSONEncodeError, TypeError):
        pass
    try:
        return canonical_of_parsed(a) == canonical_of_parsed(b)
    except (AffidavitError, RecursionError):
        return False


def _instant(text: str) -> datetime:
    """An RFC 3339 time with its offset (``Z`` or ``±hh:mm``), as an aware datetime."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _Violation("payload", f"{text!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise _Violation("payload", f"{text!r} has no UTC offset")
    return moment


def _str(p: dict[str, Any], name: str) -> str:
    value = p.get(name)
    if type(value) is not str:
        raise _Violation("payload", f"field {name!r} is missing or not a string")
    return value


def _field(value: Any, what: str, *, text: bool) -> tuple[bytes, str]:
    """A row field as the bytes the chain hashes, and what is wrong with it (``""``: nothing).
    ``text``: the format stores the field as text (else as bytes).

    Only a row edited outside the store has a field of another type (SQLite keeps whatever a
    column is given; an export may hold a string that is not Unicode text). Such a row fails
    the stored chain check whatever bytes it is hashed as; these let the pass go on."""
    if isinstance(value, str):
        try:
            return value.encode(), "" if text else f"the {what} is stored as text, not bytes"
        except UnicodeEncodeError:
            return value.encode(errors="surrogatepass"), f"the {what} is not Unicode text"
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), f"the {what} is stored as bytes, not text" if text else ""
    kind = "text" if text else "bytes"
    return repr(value).encode(), f"the {what} is {type(value).__name__}, not {kind}"


class LogFold:
    """Feed events in version order with :meth:`feed`; read the proofs afterwards.

    ``fast_paths=False`` sends every event through its handler (the reference the fast paths
    are tested against); the results are the same either way.
    """

    def __init__(self, job_id: str, *, fast_paths: bool = True) -> None:
        self.job_id = job_id
        self.approvals = ApprovalFold(job_id)  # invariant ``approval`` (verify._approvals)
        self.limits = LimitFold()  # invariant ``limit`` (verify._limits)
        self.budget: BudgetFold | None = None  # invariant ``budget`` (verify._budget)
        # event type -> (its part of the chain hash input, its fast path or 0)
        self._known = {
            t: (_SEPARATORS[t], _FAST_KINDS.get(t, 0) if fast_paths else 0) for t in _KNOWN_TYPES
        }
        # chain
        self.head = GENESIS
        self.count = 0
        self.first_bad_version: int | None = None
        self.heads: list[bytes] = []  # every recomputed H_i: the leaves of a v2 seal's events_root
        # execution hash
        self.plan_hash: str | None = None
        self._exec: Any = None
        self._finished_before_plan: list[tuple[str, str]] = []
        # the plan, reduced to what the checks need (the parsed task graph is not kept)
        self.has_plan = False
        self.steps: dict[str, str] = {}
        # the step ids the fast paths of feed_all accept: every node's but the pure sinks', whose
        # node_finished goes to its handler, which keeps their output for the job's (_outputs)
        self._fast_steps: dict[str, str] = {}
        self.node_type: dict[str, str] = {}
        self.deps: dict[str, list[str]] = {}
        self.order: tuple[str, ...] = ()
        self.tools: dict[str, Any] = {}  # tool node -> the name of its tool
        # replay state
        self.completed: set[str] = set()
        self.committed_nodes: set[str] = set()  # committed, node_finished not seen yet
        self.invocation_ids: set[str] = set()  # every invocation started
        self.open_invocations: dict[str, str] = {}  # open invocation_id -> key
        self.open_by_key: dict[str, str] = {}  # key -> open invocation_id (insertion = log order)
        # key -> (invocation, result, key, version) of a success not committed yet: T2 commits it
        # next, in the same transaction (the key itself rides along: the commit files the result
        # hash under that same string)
        self.success: dict[str, tuple[Any, Any, str, int]] = {}
        self.unknown: dict[str, None] = {}  # keys last closed as `unknown` (may have acted)
        self.committed: dict[str, str] = {}  # key -> result_hash
        # tool nodes that failed as compensatable_failure, with no step_compensated since; and
        # those with a step_compensated, not finished as compensated yet
        self.compensatable: set[str] = set()
        self.compensations: set[str] = set()
        # key -> (invocation, node_id, tool_name, args_hash, step_id) of its latest start:
        # every key invoked, and what its ledger row must say
        self.started: dict[str, tuple[str, str, Any, Any, Any]] = {}
        self.waits: dict[str, str] = {}  # correlation key -> the waiting node
        self.answered: set[str] = set()  # correlation keys a wait_completed answered
        # wait and approval node -> the payload of the wait_completed that answered it (its
        # output); kept for the plan's sinks only (see _job_completed)
        self.signals: dict[str, Any] = {}
        self._outputs: dict[str, Any] = {}  # pure sink -> the output it completed with
        self.sinks: tuple[str, ...] = ()  # nodes no node depends on: the job output's keys
        self.parked = False
        self.park: dict[str, Any] = {}  # the job_parked payload while the job is parked
        self.log_status = "pending"
        self.terminal_version: int | None = None
        self.terminal_payload: dict[str, Any] | None = None  # of job_completed or job_failed
        self.created_payload: dict[str, Any] | None = None  # of job_created
        # agent jobs: whether agent_started was read, the next step number, a tool step's
        # (idempotency key, args_hash) as its step_called implies them, the nodes whose latest
        # node_finished is a failure, and what answered each wait step (correlation key -> wake_at
        # of a timer; node -> payload of the wait_completed that answered it)
        self.agent = False
        self.next_seq = 0
        self.agent_keys: dict[str, tuple[str, str]] = {}
        self.failed_nodes: set[str] = set()
        self.timers: dict[str, tuple[str, bool]] = {}  # key -> (wake_at, a timer only)
        self.wait_payloads: dict[str, Any] = {}
        # findings
        self.replay_error: tuple[str, int | None, str] | None = None
        self.ledger_errors: list[str] = []
        self._dispatch: dict[str, Callable[[dict[str, Any]], object]] = {
            "job_created": self._job_created,
            "plan_generated": self._plan_generated,
            "node_started": self._node_started,
            "tool_invocation_started": self._invocation_started,
            "tool_invocation_finished": self._invocation_finished,
            "command_committed": self._command_committed,
            "state_changed": self._tool_step,
            "node_finished": self._node_finished,
            "job_waiting": self._job_waiting,
            "wait_completed": self._wait_completed,
            "approval_recorded": self.approvals.vote,
            "job_parked": self._job_parked,
            "job_resumed": self._job_resumed,
            "confirmation_warning": self._tool_step,
            "step_compensated": self._step_compensated,
            "job_completed": self._job_completed,
            "job_failed": self._job_failed,
            "job_cancelled": self._job_cancelled,
            "agent_started": self._agent_started,
            "step_called": self._step_called,
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
        known, keep_head = self._known, self.heads.append
        # state the handlers mutate in place (never rebound)
        completed, committed, committed_nodes = self.completed, self.committed, self.committed_nodes
        invocation_ids, started, success = self.invocation_ids, self.started, self.success
        open_invocations, open_by_key = self.open_invocations, self.open_by_key
        limited = self.limits.open  # limited calls: their handlers check the grants
        dumps, sort_keys = orjson.dumps, orjson.OPT_SORT_KEYS
        outcomes, failing, completing = _OUTCOMES, _ANY_NODE_FAILS, COMPLETED_RESULT_TYPES
        # state a handler may rebind (plan_generated, a terminal event): re-read after each call
        steps, node_type, deps, tools = self._fast_steps, self.node_type, self.deps, self.tools
        terminal, exec_update = self.terminal_version, self._exec_update()
        agent_keys, failed_nodes = self.agent_keys, self.failed_nodes
        take = iter(parsed).__next__ if parsed is not None else None
        try:
            for version, event_id, event_type, payload, stored_hash in rows:
                given = take() if take is not None else None
                count += 1
                entry = known.get(event_type)
                try:
                    if entry is None:  # an unknown type (reported below) is chained all the same
                        separator, kind = b" " + event_type.encode() + b" ", -1
                    else:
                        separator, kind = entry
                    head = sha256(
                        join(
                            (head, b"\n", event_id.encode(), separator, b2a(payload, newline=False))
                        )
                    ).digest()
                except (TypeError, AttributeError, UnicodeEncodeError):
                    # a field of another type than the format's (see _odd_row)
                    head, event_type, readable = self._odd_row(
                        head, version, event_id, event_type, payload
                    )
                    first_bad = count if first_bad is None else first_bad
                    entry = known.get(event_type) if readable is not None else None
                    kind, payload = (-1, b"") if entry is None else (entry[1], readable or b"")
                keep_head(head)
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
                                tool_name, hashed = p.get("tool_name"), p.get("args_hash")
                                prior = started.get(key, _NO_START)
                                if (
                                    type(key) is str
                                    and node_type[node_id] == "tool"
                                    and tool_name == tools[node_id]
                                    and node_id not in completed
                                    and completed.issuperset(deps[node_id])
                                    and key not in committed
                                    and key not in success
                                    and invocation not in invocation_ids
                                    and key not in open_by_key
                                    and "requires_approval" not in p
                                    and "limit_grant" not in p
                                    and (
                                        prior is _NO_START
                                        or prior[1:4] == (node_id, tool_name, hashed)
                                    )
                                    and agent_keys.get(node_id, (key, hashed)) == (key, hashed)
                                ):
                                    invocation_ids.add(invocation)
                                    open_invocations[invocation] = key
                                    open_by_key[key] = invocation
                                    started[key] = (
                                        invocation,
                                        node_id,
                                        tool_name,
                                        hashed,
                                        steps[node_id],  # (the event's, checked above)
                                    )
                                    continue
                            elif kind == _INVOCATION_FINISHED:
                                invocation = p["invocation_id"]
                                started_key = open_invocations.get(invocation)
                                outcome = p.get("outcome")
                                if (
                                    started_key is not None
                                    and started_key == p["idempotency_key"]
                                    and outcome in outcomes
                                    and started[started_key][1] == node_id
                                    and open_by_key.get(started_key) == invocation
                                    and invocation not in limited
                                ):
                                    del open_invocations[invocation]
                                    del open_by_key[started_key]
                                    if outcome == "unknown" or started_key in self.unknown:
                                        self._unknown(started_key, outcome)
                                    if outcome == "success":
                                        success[started_key] = (
                                            invocation,
                                            p.get("result"),
                                            started_key,
                                            version,
                                        )
                                    continue
                            elif kind == _COMMAND_COMMITTED:
                                commit_key = p["idempotency_key"]
                                command, result_hash = p["command_id"], p["result_hash"]
                                evidence = (
                                    success.get(commit_key) if commit_key not in committed else None
                                )
                                if (
                                    evidence is not None
                                    and evidence[0] == command
                                    and started[commit_key][1] == node_id
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
                                    and node_id not in completed
                                    and completed.issuperset(deps[node_id])
                                    and (
                                        result_type in failing
                                        or (
                                            result_type == "side_effect_committed"
                                            and node_type[node_id] == "tool"
                                            and node_id in committed_nodes
                                        )
                                        or (result_type == "pure" and node_type[node_id] != "tool")
                                    )
                                ):  # (compensations and odd result types: the handler)
                                    exec_update(f"{node_id}:{result_type}\n".encode())
                                    if result_type in completing:
                                        completed.add(node_id)
                                        committed_nodes.discard(node_id)
                                    else:
                                        failed_nodes.add(node_id)
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
                except RecursionError:
                    violate("payload", version, f"{event_type}: the payload is nested too deeply")
                steps, node_type = self._fast_steps, self.node_type
                deps, tools = self.deps, self.tools
                terminal, exec_update = self.terminal_version, self._exec_update()
        finally:
            self.head, self.count, self.first_bad_version = head, count, first_bad

    def _odd_row(
        self, head: bytes, version: Any, event_id: Any, event_type: Any, payload: Any
    ) -> tuple[bytes, Any, bytes | None]:
        """Chain a row whose fields are not all of the format's types, and report it. Return
        the new head, the type and the payload bytes to go on with (``None``: the event is not
        read further)."""
        eid, eid_problem = _field(event_id, "event id", text=True)
        kind, kind_problem = _field(event_type, "event type", text=True)
        data, data_problem = _field(payload, "payload", text=False)
        head = _sha256(
            b"".join((head, b"\n", eid, b" ", kind, b" ", binascii.b2a_base64(data, newline=False)))
        ).digest()
        problems = "; ".join(p for p in (eid_problem, kind_problem, data_problem) if p)
        label = ascii(event_type) if kind_problem else event_type
        self.violate("payload", version, f"{label}: {problems}")
        if kind_problem or not isinstance(payload, str | bytes | bytearray | memoryview):
            return head, None, None
        return head, event_type, data

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
            if self.agent:
                raise _Violation(
                    "node_in_plan", f"node {node_id!r} is not a step (no step_called before it)"
                )
            raise _Violation("node_in_plan", f"node {node_id!r} is not in the plan")
        raise _Violation(
            "node_in_plan", f"step id {step_id!r} of node {node_id!r} is not {expected!r}"
        )

    def _node(self, p: dict[str, Any], kinds: tuple[str, ...]) -> str:
        """Check the node of an event that is not a step of it (a wait, a park): in the plan,
        of one of ``kinds`` (any when empty), with the node's step id if the event names one;
        return the node id."""
        if self._exec is None:
            raise _Violation("plan", "an event naming a node before plan_generated")
        node_id = _str(p, "node_id")
        if node_id not in self.steps:
            raise _Violation("node_in_plan", f"node {node_id!r} is not in the plan")
        if "step_id" in p:
            self._step(p)
        if kinds and self.node_type[node_id] not in kinds:
            raise _Violation(
                "node_in_plan",
                f"node {node_id!r} is a {self.node_type[node_id]} node, not {' or '.join(kinds)}",
            )
        return node_id

    def _tool_step(self, p: dict[str, Any]) -> str:
        """:meth:`_step` for an event only a tool node has."""
        node_id = self._step(p)
        if self.node_type[node_id] != "tool":
            raise _Violation(
                "node_in_plan", f"node {node_id!r} is a {self.node_type[node_id]} node, not tool"
            )
        return node_id

    def _deps_completed(self, node_id: str, what: str) -> None:
        completed = self.completed
        for dep in self.deps[node_id]:
            if dep not in completed:
                raise _Violation(
                    "dependencies_first",
                    f"node {node_id!r} {what} before its dependency {dep!r} completed",
                )

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

    # --- agent jobs -----------------------------------------------------------------------------

    def _agent_started(self, p: dict[str, Any]) -> None:
        if self._exec is not None:
            what = "a second agent_started" if self.agent else "agent_started in a plan job"
            raise _Violation("plan", what)
        if self._version == 1:  # reported first; the identity is still read, for the hashes
            self.violate("plan", 1, "agent_started: the log does not start with job_created")
        name, version, recorded = p.get("agent"), p.get("agent_version"), p.get("agent_hash")
        computed: str | None = None
        if type(name) is str and type(version) is str:
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
            raise _Violation("plan", "agent_started: agent and agent_version must be text")
        if recorded != computed:
            raise _Violation(
                "plan", f"agent_hash {recorded!r} is not the hash of the agent's name and version"
            )
        if (self.created_payload or {}).get("kind") != "agent":
            raise _Violation("plan", "agent_started in a job not created as an agent job")
        self.agent = True
        self.has_plan = True
        if p.get("budget") is not None:
            # every node_finished goes through its handler from here on, for its usage
            self._known["node_finished"] = (self._known["node_finished"][0], 0)
            self.budget = BudgetFold(p["budget"])

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
        self._close(invocation, started_key, p)

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

    def _job_waiting(self, p: dict[str, Any]) -> None:
        node_id = self._node(p, ("tool",) if "call" in p else _WAIT_KINDS)  # (a call's approval)
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
            # (the key is optional in FORMATS.md §3; the runtime always names it)
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
        # (FORMATS.md §3 leaves the list open) takes any decision of the format
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
        """The job output is an object mapping each sink node's id to its output (FORMATS.md
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

    def _job_cancelled(self, p: dict[str, Any]) -> None:
        self._terminal("cancelled")

    def _terminal(self, status: str) -> None:
        self.log_status = status
        self.terminal_version = self._version
        if self._exec is None:
            raise _Violation("plan", f"the job is {status} before plan_generated")

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
            if (self.created_payload or {}).get("kind") == "agent":
                self.violate("plan", None, "the agent job's log has no agent_started event")
            else:
                self.violate("plan", None, "the log has no plan_generated event")
        if (problem := self.approvals.unmarked(self.started.values())) is not None:
            self.violate(APPROVAL, None, problem)
        if self.limits.calls and (broken := self.limits.check()) is not None:
            self.violate(LIMIT, *broken)
        uncommitted = next(iter(self.success.values()), None)  # (in log order: the first)
        if uncommitted is not None:
            self.violate(
                "commit_evidence",
                uncommitted[3],
                _uncommitted(uncommitted, "the log ends without its commit"),
            )

    @property
    def pending_keys(self) -> tuple[str, ...]:
        return tuple(self.open_by_key)

    def _unknown(self, key: str, outcome: Any) -> None:
        """Keep :attr:`unknown` (keys whose last close says the tool may or may not have acted)."""
        if outcome == "unknown":
            self.unknown[key] = None
        else:
            self.unknown.pop(key, None)
