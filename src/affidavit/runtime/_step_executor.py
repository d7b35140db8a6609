"""One step of a job: the tool-step protocol of ARCHITECTURE.md, for plan and agent jobs alike.

For a tool step (every write fenced by the claim's attempt id, through the run's
:class:`~affidavit.runtime._journal.Journal`):

(1) T1, durable: acquire the ledger row for the idempotency key (an insert only one attempt can
    win) and append ``node_started`` + ``tool_invocation_started``;
(2) execute the tool, only when (1) allowed it;
(3) T2, written (the next durable commit covers it): append ``tool_invocation_finished``,
    ``command_committed``, ``state_changed``, ``node_finished`` and mark the row committed.

A row found ``started`` by a dead attempt is in flight: the tool's ``reconcile`` decides, else
the job's (or tool's) ``in_flight`` policy parks or fails the job. A committed row is never
executed again. Retries (with backoff), timeouts and compensation are the executor's too; the
runners decide which step runs next and hand it the step's identity and resolved arguments.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from affidavit.core.approvals import NOT_APPROVED
from affidavit.core.canonical import canonical, sha256_hex
from affidavit.core.errors import CancelRequestedError, LedgerRowExists
from affidavit.core.ids import new_event_ids
from affidavit.core.plan import external_key, idempotency_key_of
from affidavit.runtime import _crash as crash
from affidavit.runtime._approvals import gate_call
from affidavit.runtime._cancel import found_nothing
from affidavit.runtime._journal import Journal, RunControl
from affidavit.runtime._limits import Grant, release_in, take_grant
from affidavit.runtime._metrics import RuntimeMetrics
from affidavit.runtime._replay import ReplayContext
from affidavit.runtime._run_base import (
    Item,
    StepFailed,
    Stop,
    StopAwareSleep,
    check_result,
    elapsed_ms,
    error_dict,
    own_args,
    recorded,
    unfit_call,
)
from affidavit.runtime._sdk import (
    CompensatableError,
    RetryableError,
    Tool,
    ToolCallError,
    ToolContext,
    ToolRegistry,
)
from affidavit.store import LedgerRow, Transaction

# The longest single wait of a concurrent step's backoff, between looks at the run's end.
_BACKOFF_SLICE = 0.1
# the error of an invocation the tool's reconcile hook found no effect of
NOT_FOUND = {"type": "lost", "message": "reconcile found no effect"}


@dataclass(frozen=True, slots=True)
class StepSpec:
    """The identity of one step: its node id and step id, its kind (``tool``, ``pure``,
    ``wait``, ``approval``, ...), the registered tool it calls (tool and pure steps) and its
    time limit per try."""

    node_id: str
    step_id: str
    kind: str
    tool: str | None = None
    timeout_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class StepPolicy:
    """The job's recorded policy, as the executor applies it."""

    in_flight: str = "park"
    max_attempts: int = 3
    backoff: float = 1.0
    replay_verification: str = "strict"

    @classmethod
    def of(cls, policy: Mapping[str, Any]) -> StepPolicy:
        """From a recorded ``policy`` object (``plan_generated`` or ``agent_started``)."""
        retry = policy.get("retry") or {}
        return cls(
            in_flight=str(policy.get("in_flight", "park")),
            max_attempts=int(retry.get("max_attempts", 3)),
            backoff=float(retry.get("backoff_seconds", 1.0)),
            replay_verification=str(policy.get("replay_verification", "strict")),
        )


class StepExecutor:
    """Runs one step at a time for one run of one job (steps of one run may call it from
    several threads: their transactions are serialized by the journal).

    ``prelude`` (every ``run_*`` method): events written just before the step's first events,
    in the same transaction — an agent job's ``step_called``."""

    def __init__(
        self,
        journal: Journal,
        tools: ToolRegistry,
        replay: ReplayContext,
        policy: StepPolicy,
        *,
        control: RunControl,
        metrics: RuntimeMetrics,
        sleep: Callable[[float], None],
        step_concurrency: int = 1,
    ) -> None:
        self.journal = journal
        self.tools = tools
        self.replay = replay
        self.policy = policy
        self.control = control
        self.metrics = metrics
        self.sleep = sleep
        self.step_concurrency = step_concurrency
        # idempotency key → the grant its limited call holds until its T2 (runtime/_limits.py)
        self.grants: dict[str, Grant] = {}
        # told each recorded step's usage (ctx.report_usage): an agent job's budget meter
        self.on_usage: Callable[[dict[str, Any]], None] | None = None

    @property
    def job_id(self) -> str:
        return self.journal.claim.job_id

    # --- lookups ------------------------------------------------------------------------------

    def tool_of(self, spec: StepSpec) -> Tool:
        """The registered function of a tool or pure step.

        Raises:
            StepFailed: not registered in this worker (or registered as the other kind).
        """
        found = self.tools.get(spec.tool or "")
        if found is None or found.kind != spec.kind:
            raise StepFailed(
                spec.node_id,
                {
                    "type": "tool_not_registered",
                    "message": f"{spec.kind} {spec.tool!r} of node {spec.node_id!r} is not "
                    "registered in this worker",
                },
            )
        return found

    @staticmethod
    def retryable(t: Tool, exc: BaseException) -> bool:
        """Whether ``exc`` from ``t`` is worth another try."""
        if isinstance(exc, ToolCallError):  # fails before the function runs, every time
            return False
        return isinstance(exc, RetryableError | TimeoutError) or (
            bool(t.retry_on) and isinstance(exc, t.retry_on)
        )

    # --- tool ---------------------------------------------------------------------------------

    def run_tool(
        self,
        spec: StepSpec,
        args: dict[str, Any],
        args_jcs: bytes,
        *,
        prelude: tuple[Item, ...] = (),
    ) -> Any:
        """Run a tool step through the ledger (T1 → execute → T2) and return its result as
        recorded; a committed result is returned without calling the tool.

        Raises:
            StepFailed: the step failed for good (the job fails).
            Stop: the job parked or failed on an in-flight invocation, or the run must end.
        """
        t = self.tool_of(spec)
        node_id, step = spec.node_id, spec.step_id
        job_id = self.job_id
        claim = self.journal.claim
        key = idempotency_key_of(job_id, step, t.name, args_jcs)
        hashed_args = hashlib.sha256(args_jcs).hexdigest()[:16]  # = args_hash(args)
        attempt = self.replay.node_attempts.get(node_id, 0)
        limit = t.retry or self.policy.max_attempts
        base = {"node_id": node_id, "step_id": step}
        approval = gate_call(
            self.journal, self.replay, t, node_id, step, args_jcs, hashed_args, prelude
        )
        gated = {"requires_approval": True, "approval_key": approval} if approval else {}
        self._backoff_left(node_id)
        while True:
            attempt += 1
            # the invocation id and the ids of T1's events, in one call
            invocation, *started_ids = new_event_ids(3 + len(prelude))
            if t.limit is not None:  # wait for a slot; nothing is recorded meanwhile
                self.grants[key] = take_grant(self.journal, self.control, t.name, t.limit)
                gated = {**gated, "limit_grant": self.grants[key].record()}
            started_events: tuple[Item, Item] = (
                ("node_started", {**base, "attempt": attempt, "worker_id": claim.worker_id}),
                (
                    "tool_invocation_started",
                    {
                        **base,
                        "invocation_id": invocation,
                        "tool_name": t.name,
                        "idempotency_key": key,
                        "args_hash": hashed_args,
                        "attempt": attempt,
                        **gated,
                    },
                ),
            )
            # (1) T1: acquire + started, durable before the tool may act. A step the log has
            # never started has no ledger row: the insert is presumed new (PostgreSQL sends it
            # unanswered, T1 in one round trip); if a row was there after all, nothing was
            # written and T1 runs again reading it.
            t1 = (spec, t.name, key, hashed_args, invocation, (*prelude, *started_events))
            try:
                row = self.journal.tx_retrying(True, self._acquire, *t1, started_ids, attempt == 1)
            except LedgerRowExists:
                row = self.journal.tx_retrying(True, self._acquire, *t1, started_ids, False)
            prelude = ()  # written with the first T1
            self.metrics.ledger_decisions.inc(
                "allow_execute"
                if row is None or row.status == "failed"
                else "return_recorded_result"
                if row.status == "committed"
                else "in_flight"
            )
            if row is not None and row.status == "committed":
                committed = row.result  # as recorded (read back from the ledger)
                # The log is the authority and already holds the commit (T2 is atomic); this
                # only records the node's completion if a crash came between T2 and nothing.
                self.journal.write(
                    (
                        "node_finished",
                        {
                            **base,
                            "result_type": "side_effect_committed",
                            "attempt": attempt,
                            "duration_ms": 0,
                        },
                    )
                )
                self._release(key)
                return committed
            if row is not None and row.status == "started":
                outcome = self._in_flight(spec, t, args, key, row, attempt, started_events)
                if outcome is not None:
                    self._release(key)
                    return outcome[0]
                # not found by reconcile: the dead invocation is closed and ours is started
                invocation = str(started_events[1][1]["invocation_id"])
            crash.crash_point("tool.after_acquire")
            # The lease may have been taken over while T1 committed, or may have run out while
            # this process was frozen: then do not act. The invocation stays open for the new
            # owner, whose reconcile (or in-flight policy) decides — never a second blind
            # execution from here.
            self.control.confirm_lease()
            # (2) execute
            ctx = ToolContext(
                job_id, node_id, step, attempt, key, external_key(job_id, step, claim.attempt_id)
            )
            t0 = time.perf_counter()
            returned = False
            try:
                result = self.call(spec, t.fn, ctx, args)
                returned = True
                result_jcs = check_result(node_id, t, result)
            except BaseException as exc:
                if not isinstance(exc, Exception) and not self.retryable(t, exc):
                    # KeyboardInterrupt, SystemExit, ...: the run ends as in a crash, the
                    # invocation open; a type listed in ``retry_on`` is a failure like any other.
                    raise
                # A result that cannot be recorded is never retried, whatever ``retry_on``
                # says: the tool returned, so it acted, and another try would act again.
                retryable = not returned and self.retryable(t, exc)
                result_type = (
                    "compensatable_failure"
                    if isinstance(exc, CompensatableError)
                    else "retryable_failure"
                    if retryable
                    else "permanent_failure"
                )
                error = error_dict(exc)
                finished: tuple[Item, Item] = (
                    (
                        "tool_invocation_finished",
                        {
                            **base,
                            "invocation_id": invocation,
                            "idempotency_key": key,
                            "outcome": "timeout" if isinstance(exc, TimeoutError) else "failure",
                            "error": error,
                            "catch_up": False,
                        },
                    ),
                    (
                        "node_finished",
                        {
                            **base,
                            "result_type": result_type,
                            "error": error,
                            "attempt": attempt,
                            "duration_ms": elapsed_ms(t0),
                        },
                    ),
                )
                self.journal.tx_retrying(False, self._record_failure, key, finished, error)
                self.grants.pop(key, None)
                if isinstance(exc, CompensatableError):
                    self._compensate(spec, t, ctx, args, base, attempt)
                    raise StepFailed(node_id, error) from exc
                if retryable and attempt < limit:
                    self.backoff(attempt)
                    continue
                raise StepFailed(node_id, error) from exc
            crash.crash_point("tool.after_execute")
            # (3) T2: finished + committed + node_finished, and the ledger row, together.
            output = self.commit(
                durable=False,
                spec=spec,
                key=key,
                invocation=invocation,
                result=result,
                attempt=attempt,
                t0=t0,
                ctx=ctx,
                catch_up=False,
                result_jcs=result_jcs,
            )
            crash.crash_point("tool.after_commit")
            return output

    def _acquire(
        self,
        tx: Transaction,
        spec: StepSpec,
        tool_name: str,
        key: str,
        hashed_args: str,
        invocation: str,
        started_events: tuple[Item, ...],
        started_ids: list[str],
        presumed_new: bool,
    ) -> LedgerRow | None:
        """T1's writes: the ledger row only one attempt can win, and the started events when
        this attempt may execute. Returns the row found instead of inserted (``None`` when the
        insert won). ``presumed_new``: see :meth:`Transaction.ledger_insert`."""
        job_id = self.job_id
        claim = self.journal.claim
        # The insert comes first: on the usual path (a key never seen) it is the only ledger
        # statement of T1.
        inserted = tx.ledger_insert(
            job_id=job_id,
            key=key,
            node_id=spec.node_id,
            step_id=spec.step_id,
            tool_name=tool_name,
            args_hash=hashed_args,
            invocation_id=invocation,
            attempt_id=claim.attempt_id,
            presumed_new=presumed_new,
        )
        row: LedgerRow | None = None if inserted else tx.ledger_get(job_id, key)
        if row is None:
            self.journal.append(tx, *started_events, fast=True, ids=started_ids)
        elif row.status == "failed":
            tx.ledger_restart(job_id, key, invocation_id=invocation, attempt_id=claim.attempt_id)
            self.journal.append(tx, *started_events, fast=True)
        return row

    def _record_failure(
        self, tx: Transaction, key: str, items: tuple[Item, Item], error: dict[str, Any]
    ) -> None:
        """A failed attempt's T2: its finished events, and its ledger row marked failed (so a
        retry may run the tool again)."""
        self.journal.append(tx, *items)
        tx.ledger_finish(self.job_id, key, status="failed", error=error)
        if self.grants:
            release_in(tx, self.grants.get(key))

    def commit(
        self,
        *,
        durable: bool,
        spec: StepSpec,
        key: str,
        invocation: str,
        result: Any,
        attempt: int,
        t0: float,
        ctx: ToolContext | None,
        catch_up: bool,
        step_id: str | None = None,
        result_jcs: bytes | None = None,
    ) -> Any:
        """T2 (or a catch-up's commit). Returns the result as recorded — read back from its
        canonical bytes, as a replay reads it — for the steps that take it as their input."""
        base = {"node_id": spec.node_id, "step_id": step_id or spec.step_id}
        jcs = result_jcs if result_jcs is not None else canonical(result)
        items: list[Item] = [
            (
                "tool_invocation_finished",
                {
                    **base,
                    "invocation_id": invocation,
                    "idempotency_key": key,
                    "outcome": "success",
                    "result": orjson.Fragment(jcs),
                    "catch_up": catch_up,
                },
            ),
            (
                "command_committed",
                {
                    **base,
                    "command_id": invocation,
                    "idempotency_key": key,
                    "result_hash": sha256_hex(jcs),
                },
            ),
        ]
        if ctx is not None and ctx.state_changes:
            changes = canonical([c.to_dict() for c in ctx.state_changes])
            items.append(("state_changed", {**base, "state_changes": orjson.Fragment(changes)}))
        items.append(
            (
                "node_finished",
                {
                    **base,
                    "result_type": "side_effect_committed",
                    "attempt": attempt,
                    "duration_ms": elapsed_ms(t0),
                    **({"usage": ctx.usage} if ctx is not None and ctx.usage else {}),
                },
            )
        )
        if ctx is not None:
            self._count_usage(ctx)
        self.journal.tx_retrying(durable, self._commit_txn, items, key, result, jcs)
        if self.grants:
            self.grants.pop(key, None)
        return recorded(jcs)

    def _commit_txn(
        self, tx: Transaction, items: list[Item], key: str, result: Any, jcs: bytes
    ) -> None:
        """T2's writes: the step's closing events and its ledger row committed."""
        self.journal.append(tx, *items, fast=True)
        tx.ledger_finish(self.job_id, key, status="committed", result=result, result_jcs=jcs)
        if self.grants:  # T2 ends the call's grant
            release_in(tx, self.grants.get(key))

    def _count_usage(self, ctx: ToolContext) -> None:
        """Before a step's record: count what it spent (so that a call admitted meanwhile, by
        another thread of the run, is checked against it; a record that then fails counts
        anyway, which errs on the side of the budget)."""
        if ctx.usage and self.on_usage is not None:
            self.on_usage(ctx.usage)

    def _used(self, grant: Grant | None) -> None:
        """After a limited pure step's record: give back its grant."""
        if grant is not None:
            with self.journal.store.transaction(durable=False) as tx:
                release_in(tx, grant)

    def _release(self, key: str) -> None:
        """Give back the grant of a limited call that ends without running the tool."""
        grant = self.grants.pop(key, None)
        if grant is not None:
            with self.journal.store.transaction(durable=False) as tx:
                release_in(tx, grant)

    # --- in flight ----------------------------------------------------------------------------

    def reconcile(
        self, spec: StepSpec, t: Tool, args: dict[str, Any], key: str, row: LedgerRow, attempt: int
    ) -> tuple[tuple[Any] | None, dict[str, Any] | None]:
        """Ask ``t``'s reconcile hook whether the invocation a dead attempt left open (``row``)
        acted, with that attempt's external key. An effect found is committed at once as a
        catch-up (``((result,), None)``); ``(None, None)`` when the hook found nothing,
        ``(None, error)`` when the lookup itself failed. Nothing is written then."""
        assert t.reconcile_fn is not None
        job_id = self.job_id
        ctx = ToolContext(
            job_id,
            spec.node_id,
            row.step_id,
            attempt,
            key,
            external_key(job_id, row.step_id, row.attempt_id),
        )
        t0 = time.perf_counter()
        try:
            found = self.call(spec, t.reconcile_fn, ctx, args)
            if found is not None:
                check_result(spec.node_id, t, found)
        except Exception as exc:  # the lookup failed (or timed out): decided as without a hook
            return None, error_dict(exc)
        if found is None:
            return None, None
        output = self.commit(
            durable=False,
            spec=spec,
            step_id=row.step_id,
            key=key,
            invocation=row.invocation_id,
            result=found,
            attempt=attempt,
            t0=t0,
            ctx=ctx,
            catch_up=True,
        )
        return (output,), None

    def _in_flight(
        self,
        spec: StepSpec,
        t: Tool,
        args: dict[str, Any],
        key: str,
        row: LedgerRow,
        attempt: int,
        started_events: tuple[Item, Item],
    ) -> tuple[Any] | None:
        """Resolve an invocation that a dead attempt started and never finished. Returns
        ``(result,)`` when reconcile found the effect (caught up), ``None`` when it found
        nothing (the dead invocation is closed as lost and ours is started); parks or fails
        the job otherwise (raising)."""
        job_id = self.job_id
        node_id = spec.node_id
        base = {"node_id": node_id, "step_id": row.step_id}
        dead = row.invocation_id
        # What is decided about the dead invocation is its attempt's outcome (its node_started
        # is the latest), as a person's decision on it is; ``attempt`` is the next one's.
        dead_attempt = self.replay.node_attempts.get(node_id, attempt)
        reconcile_error: dict[str, Any] | None = None
        if t.reconcile_fn is not None:
            found, reconcile_error = self.reconcile(spec, t, args, key, row, dead_attempt)
            if found is not None:
                return found
            if reconcile_error is None:
                invocation = started_events[1][1]["invocation_id"]
                attempt_id = self.journal.claim.attempt_id

                def restart(tx: Transaction) -> None:
                    self.journal.append(
                        tx,
                        (
                            "tool_invocation_finished",
                            {
                                **base,
                                "invocation_id": dead,
                                "idempotency_key": key,
                                "outcome": "lost",
                                "error": NOT_FOUND,
                                "catch_up": True,
                            },
                        ),
                        *started_events,
                    )
                    tx.ledger_restart(job_id, key, invocation_id=invocation, attempt_id=attempt_id)

                try:
                    self.journal.tx_retrying(True, restart)
                except CancelRequestedError:  # no new try: the found-nothing is recorded alone
                    found_nothing(self.journal, base, dead, key, NOT_FOUND)
                    raise
                return None
        policy = t.in_flight or self.policy.in_flight
        detail: dict[str, Any] = {
            "invocation_id": dead,
            "dead_attempt_id": row.attempt_id,
            "tool_name": t.name,
            "message": "the tool may or may not have acted; it has no reconcile hook",
        }
        if reconcile_error is not None:
            detail["message"] = "the tool may or may not have acted; its reconcile hook failed"
            detail["reconcile_error"] = reconcile_error
        if policy == "park":
            raise self.journal.park(
                "in_flight",
                node_id=node_id,
                step_id=row.step_id,
                detail=detail,
                idempotency_key=key,
            )
        error = {**detail, "type": "in_flight", "message": "invocation in flight or lost"}

        def fail(tx: Transaction) -> None:
            self.journal.close_open(tx, keep=key)
            self.journal.append(
                tx,
                (
                    "tool_invocation_finished",
                    {
                        **base,
                        "invocation_id": dead,
                        "idempotency_key": key,
                        "outcome": "unknown",  # (the tool may or may not have acted)
                        "error": error,
                        "catch_up": True,
                    },
                ),
                (
                    "node_finished",
                    {
                        **base,
                        "result_type": "permanent_failure",
                        "error": error,
                        "attempt": dead_attempt,
                        "duration_ms": 0,
                    },
                ),
                ("job_failed", {"error": error, "node_id": node_id}),
            )
            tx.ledger_finish(job_id, key, status="failed", error=error)
            tx.set_status(job_id, status="failed", error=error, fence=self.journal.claim.attempt_id)
            self.journal.seal(tx)

        self.journal.tx_retrying(True, fail)
        raise Stop("failed")

    def _compensate(
        self,
        spec: StepSpec,
        t: Tool,
        ctx: ToolContext,
        args: dict[str, Any],
        base: dict[str, Any],
        attempt: int,
    ) -> None:
        if t.compensate_fn is None:
            return
        self.control.confirm_lease()
        ctx.close(
            f"the compensation of step {spec.node_id!r} is recorded from what it returns "
            "(step_compensated), not as state changes"
        )
        try:
            details = self.call(spec, t.compensate_fn, ctx, args)
            canonical(details)
        except Exception as exc:
            raise StepFailed(
                spec.node_id,
                {
                    "type": "compensation_failed",
                    "message": f"compensation of {spec.node_id!r} failed: "
                    f"{error_dict(exc)['message']}",
                },
            ) from exc
        self.journal.write(
            ("step_compensated", {**base, "compensation": details}),
            (
                "node_finished",
                {
                    **base,
                    "result_type": "compensated",
                    "attempt": attempt,
                    "duration_ms": 0,
                },  # (no output: a tool node's; the compensation is in step_compensated)
            ),
        )

    # --- pure ---------------------------------------------------------------------------------

    def run_pure(
        self, spec: StepSpec, args: dict[str, Any], *, prelude: tuple[Item, ...] = ()
    ) -> Any:
        """Run a pure step (retried under the policy) and return its output as recorded. Its
        events are written after it returns, in one transaction: a pure step that did not
        finish runs again on recovery.

        Raises:
            StepFailed: the step failed for good.
        """
        t = self.tool_of(spec)
        node_id, step = spec.node_id, spec.step_id
        claim = self.journal.claim
        attempt = self.replay.node_attempts.get(node_id, 0)
        limit = t.retry or self.policy.max_attempts
        self._backoff_left(node_id)
        while True:
            attempt += 1
            started = {
                "node_id": node_id,
                "step_id": step,
                "attempt": attempt,
                "worker_id": claim.worker_id,
            }
            ctx = ToolContext(
                claim.job_id,
                node_id,
                step,
                attempt,
                None,
                external_key(claim.job_id, step, claim.attempt_id),
            )
            ctx.close(f"pure step {node_id!r} changes nothing outside")
            grant = take_grant(self.journal, self.control, t.name, t.limit) if t.limit else None
            t0 = time.perf_counter()
            try:
                output = self.call(spec, t.fn, ctx, args)
                output_jcs = check_result(node_id, t, output)
            except Exception as exc:
                retry = self.retryable(t, exc) and attempt < limit
                finished: dict[str, Any] = {
                    "node_id": node_id,
                    "step_id": step,
                    "attempt": attempt,
                    "result_type": "retryable_failure"
                    if self.retryable(t, exc)
                    else "permanent_failure",
                    "error": error_dict(exc),
                    "duration_ms": elapsed_ms(t0),
                    **({"usage": ctx.usage} if ctx.usage else {}),
                    **({"limit_grant": grant.record()} if grant else {}),
                }
                self._count_usage(ctx)
                self.journal.write(*prelude, ("node_started", started), ("node_finished", finished))
                self._used(grant)
                prelude = ()
                if retry:
                    self.backoff(attempt)
                    continue
                raise StepFailed(node_id, error_dict(exc)) from exc
            crash.crash_point("pure.after_execute")
            finished = {
                "node_id": node_id,
                "step_id": step,
                "attempt": attempt,
                "result_type": "pure",
                "output": orjson.Fragment(output_jcs),
                "duration_ms": elapsed_ms(t0),
                **({"usage": ctx.usage} if ctx.usage else {}),
                **({"limit_grant": grant.record()} if grant else {}),
            }
            self._count_usage(ctx)
            self.journal.write(
                *prelude, ("node_started", started), ("node_finished", finished), fast=True
            )
            self._used(grant)
            return recorded(output_jcs)

    # --- wait / approval (continued by signals or timers) -------------------------------------

    def run_wait(
        self,
        spec: StepSpec,
        *,
        correlation_key: str,
        wait_type: str,
        reason: str,
        extra: Mapping[str, Any] | None = None,
        wake_at: float | None = None,
        prelude: tuple[Item, ...] = (),
    ) -> Any:
        """A wait (``wait_type`` ``signal``, ``approval`` or ``timer``): when the log holds its
        ``wait_completed``, finish the step and return the signal's payload; otherwise record
        the wait (``extra``: more fields of ``job_waiting``; ``wake_at``: when a timer makes the
        job claimable again) unless it is recorded already, and end the run as ``waiting``.

        Raises:
            Stop: ``"waiting"``.
            StepFailed: an approval answered ``{"approved": false}``.
        """
        done = self.replay.completed_waits.get(correlation_key)
        base = {"node_id": spec.node_id, "step_id": spec.step_id}
        if done is not None:
            payload = done.get("payload")
            approved = not (
                wait_type == "approval"
                and isinstance(payload, dict)
                and payload.get("approved") is False
            )
            finished: dict[str, Any] = {
                **base,
                "attempt": 1,
                "result_type": "pure" if approved else "permanent_failure",
                "duration_ms": 0,
            }
            if approved:
                finished["output"] = payload
            else:
                finished["error"] = dict(NOT_APPROVED)
            self.journal.write(*prelude, ("node_finished", finished))
            if not approved:
                # (the error recorded: a recovery that ends the job from the log says the same)
                raise StepFailed(spec.node_id, dict(NOT_APPROVED))
            return payload
        if correlation_key not in self.replay.waits:
            started = {**base, "attempt": 1, "worker_id": self.journal.claim.worker_id}
            waiting = {
                "node_id": spec.node_id,
                "wait_type": wait_type,
                "correlation_key": correlation_key,
                "reason": reason,
                **(extra or {}),
            }
            raise self.journal.wait(
                *prelude, ("node_started", started), ("job_waiting", waiting), wake_at=wake_at
            )
        raise Stop("waiting")

    # --- calls, retries -----------------------------------------------------------------------

    def call(
        self, spec: StepSpec, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
    ) -> Any:
        """Call ``fn`` (a tool, a pure function, a reconcile hook or a compensation) for the
        step, within its ``timeout_seconds`` if it has one (``TimeoutError``); the context
        records nothing afterwards."""
        # Each try gets its own copy: a tool that changes its arguments (or an abandoned
        # timed-out try still running) must not change what a retry, a compensation or a later
        # step sees — the resolved args share objects with the input and upstream outputs.
        args = own_args(args)
        try:
            if spec.timeout_seconds is None:
                return fn(ctx, **args)
            return _call_timed(spec, fn, ctx, args)
        except TypeError as exc:
            unfit = unfit_call(spec.node_id, fn, ctx, args)
            if unfit is None:  # the call fit: the error came from within the function
                raise
            raise unfit from exc
        finally:
            ctx.close(f"step {spec.node_id!r} (attempt {ctx.attempt}) is over")

    def backoff_delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt``: the policy's backoff, doubled per
        attempt, at most a minute."""
        # (2**1024 is past any float; by 2**1000 any backoff above 1e-299 s is at the cap)
        return min(self.policy.backoff * 2.0 ** min(attempt - 1, 1000), 60.0)

    def _backoff_left(self, node_id: str) -> None:
        """Before a step's first try in this run: when its last try, recorded by an earlier
        run (one that stopped or died in the backoff), failed retryably and no try started
        since, wait what is left of that backoff — measured from the failure's recorded time —
        so that handing a job over does not hit a rate-limited service again at once."""
        last = self.replay.node_finished.get(node_id)
        if (
            self.policy.backoff <= 0
            or last is None
            or last.get("result_type") != "retryable_failure"
            or self.replay.node_attempts.get(node_id) != last.get("attempt")
        ):
            return
        try:
            failed_at = datetime.fromisoformat(str(last["at"])).timestamp()
        except (KeyError, ValueError):
            return  # (the log's shape was checked by the replay; a time it cannot read: no wait)
        delay = self.backoff_delay(int(last["attempt"]))
        # (another worker's clock may be ahead: never more than the backoff itself)
        self.backoff(int(last["attempt"]), min(delay, failed_at + delay - time.time()))

    def backoff(self, attempt: int, delay: float | None = None) -> None:
        """Wait before the next attempt of a step whose failure is recorded (nothing open):
        ``delay`` seconds, by default the whole backoff after ``attempt``. A stopping worker
        ends the run here instead: the next attempt runs wherever the job is claimed next,
        after what is left of the backoff, and counts on from the recorded ones. So does the
        end of a run of concurrent steps (another step failed the job, say): no new try starts
        in a job whose end is decided — the recovery of a run that died here would not start
        one either. A lease a heartbeat found lost (the job was cancelled, or taken over) ends
        the wait as ``"lost"``: the next try could write nothing. (A wait given to the worker
        as ``sleep`` is called as it is, in slices only for concurrent steps.)"""
        if delay is None:
            delay = self.backoff_delay(attempt) if self.policy.backoff > 0 else 0.0
        control = self.control
        if delay > 0:
            lost = control.lease_lost

            def over() -> bool:  # the worker stops, the run ends, or the lease is lost
                return control.ending_now() or (lost is not None and lost.is_set())

            if isinstance(self.sleep, StopAwareSleep):  # the worker's own wait
                self.sleep(delay, over)
            elif self.step_concurrency == 1:
                self.sleep(delay)
            else:  # in slices, so that the run's end cuts it
                while delay > 0 and not over():
                    self.sleep(min(delay, _BACKOFF_SLICE))
                    delay -= _BACKOFF_SLICE
            control.check_lease()
        control.check_stopping()


def _call_timed(
    spec: StepSpec, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
) -> Any:
    outcome: Future[Any] = Future()

    def call() -> None:
        try:
            outcome.set_result(fn(ctx, **args))
        except BaseException as exc:
            outcome.set_exception(exc)

    # A daemon thread, not a pool's: the interpreter joins a pool's threads at exit, so a
    # timed-out try that never returns would keep the worker process from ever exiting.
    threading.Thread(target=call, name=f"affidavit-{spec.node_id}", daemon=True).start()
    try:
        return outcome.result(timeout=spec.timeout_seconds)
    except FutureTimeout:
        raise TimeoutError(
            f"step {spec.node_id!r} timed out after {spec.timeout_seconds}s"
        ) from None
