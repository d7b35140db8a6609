"""One streaming pass over a job's log that computes every proof at once.

The log is read once, in version order, and never held: per event the pass updates the chain
(recomputed root and stored-hash check), the execution hash, and a small replay state — the plan,
which nodes completed, which invocations are open, which keys were committed with which result
hash. Memory grows with the plan and the number of idempotency keys, not with the log.

Invariants of the replay proof (docs/verification.md, "Replay invariants"), each reported by name
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
     key names an open invocation of its node; a key closed as ``timeout`` starts again only
     if its start declared ``idempotent`` (and a timed-out closing agrees with its start);
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

And for every job, (13) ``stream``: the ``stream_emitted`` values are numbered 0, 1, 2, … in
log order, each at most 64 KiB as canonical JSON, within the job's stream limit, and each names
a step of the job not completed yet — or, in an agent job, none (the agent function's own
value); see :mod:`affidavit.verify._streams`.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from affidavit.core.events import COMPLETED_RESULT_TYPES
from affidavit.verify._approvals import INVARIANT as APPROVAL
from affidavit.verify._fold_state import (
    _ANY_NODE_FAILS,
    _COMMAND_COMMITTED,
    _INVOCATION_FINISHED,
    _INVOCATION_STARTED,
    _KNOWN_TYPES,
    _NO_START,
    _NODE_STARTED,
    _NOT_RUNNING,
    _NOWHERE,
    _OUTCOMES,
    _field,
    _sha256,
    _uncommitted,
)
from affidavit.verify._fold_waits import EndEvents
from affidavit.verify._limits import INVARIANT as LIMIT
from affidavit.verify._streams import INVARIANT as STREAM
from affidavit.verify._violation import _Violation


class LogFold(EndEvents):
    """Feed events in version order with :meth:`feed`; read the proofs afterwards.

    ``fast_paths=False`` sends every event through its handler (the reference the fast paths
    are tested against); the results are the same either way.
    """

    def __init__(self, job_id: str, *, fast_paths: bool = True) -> None:
        super().__init__(job_id, fast_paths=fast_paths)
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
            "stream_emitted": self._stream_emitted,
            "child_completed": self._child_completed,
        }
        assert set(self._dispatch) == _KNOWN_TYPES

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
        version order. Long because it is the hot loop of verification (once per event of
        every log verified): its state lives in locals while it runs, and splitting out the
        fast paths or the chain step would cost a call and the re-reading of this state per
        event; ``benchmarks/`` measures it.

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
        timed, timed_out = self.timed, self.timed_out  # timeouts: their handlers check them
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
                                    and "timeout_seconds" not in p
                                    and "idempotent" not in p
                                    and key not in timed_out
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
                                    and invocation not in timed
                                    and outcome != "timeout"
                                    and "resolution" not in p
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
                                    and "limit_grant" not in p
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

    def _stream_emitted(self, p: dict[str, Any]) -> None:
        node_id = self.streams.emitted(p)
        if node_id is None:
            if not self.agent:
                raise _Violation(STREAM, "a value with no step in a job with no agent function")
            return
        self._step(p)
        if node_id in self.completed:
            raise _Violation(STREAM, f"a value of step {node_id!r}, which had completed")

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
