"""The state of the one pass over a job's log (:class:`~affidavit.verify._fold.LogFold`) and
what every handler shares: the constants, finding a violation, checking a step event's node.

The handlers are layered by what they read: the plan and the agent's steps
(:mod:`~affidavit.verify._fold_plan`), the tool steps (:mod:`~affidavit.verify._fold_tools`),
the waits, parks and the job's end (:mod:`~affidavit.verify._fold_waits`); ``LogFold`` adds the
pass itself."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson

from affidavit.core.canonical import canonical_of_parsed
from affidavit.core.chain import GENESIS
from affidavit.core.errors import AffidavitError
from affidavit.core.events import EventType
from affidavit.verify._approvals import ApprovalFold
from affidavit.verify._budget import BudgetFold
from affidavit.verify._limits import LimitFold
from affidavit.verify._streams import StreamFold
from affidavit.verify._violation import _Violation

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
_WAIT_KINDS = (
    "wait",
    "approval",
    "sleep",
    "join",
)  # (join: waits for child jobs)  # (sleep: an agent's durable timer)
# the wait_type of a job_waiting, by the type of the node that waits (docs/formats.md §3)
_WAIT_TYPE = {
    "wait": "signal",
    "approval": "approval",
    "sleep": "timer",
    "join": "child",
    "job": "child",  # a plan's job node (an agent's job step never waits)
}
_JOIN_NODES = {True: ("join",), False: ("job",)}  # what awaits children: an agent's, a plan's
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


class FoldState:
    """The replay state, the findings, and the checks every handler shares."""

    def __init__(self, job_id: str, *, fast_paths: bool = True) -> None:
        self.job_id = job_id
        self.approvals = ApprovalFold(job_id)  # invariant ``approval`` (verify._approvals)
        self.limits = LimitFold()  # invariant ``limit`` (verify._limits)
        self.budget: BudgetFold | None = None  # invariant ``budget`` (verify._budget)
        self.streams = StreamFold()  # invariant ``stream`` (verify._streams)
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
        # open invocation -> (timeout_seconds, idempotent) its start declared, if either; and
        # key -> idempotent, of a key last closed as `timeout` (runtime/_timeouts.py)
        self.timed: dict[str, tuple[Any, bool]] = {}
        self.timed_out: dict[str, bool] = {}
        self.committed: dict[str, str] = {}  # key -> result_hash
        # tool nodes that failed as compensatable_failure, with no step_compensated since; and
        # those with a step_compensated, not finished as compensated yet
        self.compensatable: set[str] = set()
        self.compensations: set[str] = set()
        # key -> (invocation, node_id, tool_name, args_hash, step_id) of its latest start:
        # every key invoked, and what its ledger row must say
        self.started: dict[str, tuple[str, str, Any, Any, Any]] = {}
        self.waits: dict[str, str] = {}  # correlation key -> the waiting node
        self.children: list[dict[str, Any]] = []  # child_completed, in log order
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
        self._version = 0

    # --- findings -------------------------------------------------------------------------------

    def violate(self, invariant: str, version: int | None, detail: str) -> None:
        """Record a violated invariant; only the first one is reported."""
        if self.replay_error is None:
            self.replay_error = (invariant, version, detail)

    def ledger_error(self, message: str) -> None:
        if len(self.ledger_errors) < 20:
            self.ledger_errors.append(message)

    # --- shared checks ---------------------------------------------------------------------------

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

    def _unknown(self, key: str, outcome: Any) -> None:
        """Keep :attr:`unknown` (keys whose last close says the tool may or may not have acted)."""
        if outcome == "unknown":
            self.unknown[key] = None
        else:
            self.unknown.pop(key, None)
