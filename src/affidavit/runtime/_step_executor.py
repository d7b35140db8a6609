"""One step of a job: the tool-step protocol (docs/runtime.md), for plan and agent jobs alike.

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

The parts live beside it: T1, T2 and the compensation's record in
:mod:`~affidavit.runtime._ledger_steps`, an invocation a dead attempt left open in
:mod:`~affidavit.runtime._in_flight`, calling a step's function and the backoff between tries in
:mod:`~affidavit.runtime._step_calls`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from affidavit.core import crash
from affidavit.core.errors import CancelRequestedError, LedgerRowExists
from affidavit.core.ids import new_event_ids
from affidavit.core.plan import external_key, idempotency_key_of
from affidavit.core.privacy import is_sealed
from affidavit.record import ReplayContext
from affidavit.runtime._approvals import gate_call
from affidavit.runtime._in_flight import reconcile, resolve_in_flight
from affidavit.runtime._journal import Journal, RunControl
from affidavit.runtime._ledger_steps import acquire, commit, compensate, record_failure
from affidavit.runtime._limits import Grant, release_in, take_grant
from affidavit.runtime._metrics import RuntimeMetrics
from affidavit.runtime._pure_steps import run_pure
from affidavit.runtime._run_base import (
    Item,
    StepFailed,
    StopAwareSleep,
    check_result,
    elapsed_ms,
    error_dict,
)
from affidavit.runtime._sdk import (
    CompensatableError,
    RetryableError,
    Tool,
    ToolCallError,
    ToolCancelled,
    ToolContext,
    ToolRegistry,
)
from affidavit.runtime._step_calls import CallTimedOut, backoff_delay, backoff_left, call_step
from affidavit.runtime._stream import StreamWriter
from affidavit.runtime._timeouts import resolve_timeout
from affidavit.runtime._wait_steps import run_wait
from affidavit.store import LedgerRow

# The longest single wait of a concurrent step's backoff, between looks at the run's end.
_BACKOFF_SLICE = 0.1


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


@dataclass(frozen=True, slots=True)
class _Try:
    """One try of a tool step, as its failure is recorded."""

    spec: StepSpec
    tool: Tool
    ctx: ToolContext
    args: dict[str, Any]
    base: dict[str, Any]  # the step's node id and step id
    attempt: int
    invocation: str
    key: str  # the idempotency key
    t0: float  # when the call began (time.perf_counter)


def _timed(spec: StepSpec, t: Tool) -> dict[str, Any]:
    """The fields of a try's ``tool_invocation_started`` that say how a timeout of it is
    resolved (runtime/_timeouts.py): its time limit, and the tool's ``idempotent``."""
    fields: dict[str, Any] = {}
    if spec.timeout_seconds is not None:
        fields["timeout_seconds"] = spec.timeout_seconds
    if t.idempotent:
        fields["idempotent"] = True
    return fields


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
        # a subject's job: the key its values are sealed under (core/privacy.py)
        self.cipher = journal.store.writer_cipher(journal.claim.job_id)
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
        # the job's live stream (ctx.emit), which the steps' functions write to while they run
        self.stream = StreamWriter(journal, replay)

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
        timeout = spec.timeout_seconds if spec.timeout_seconds is not None else t.timeout_seconds
        if timeout is not None:  # (the tool's default; recorded as canonical JSON writes it)
            spec = replace(spec, timeout_seconds=int(timeout) if timeout % 1 == 0 else timeout)
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
        self.wait_out_backoff(node_id)
        while True:
            attempt += 1
            # the invocation id and the ids of T1's events, in one call
            invocation, *started_ids = new_event_ids(3 + len(prelude))
            if t.limit is not None:  # wait for a slot; nothing is recorded meanwhile
                self.grants[key] = take_grant(self.journal, self.control, t.name, t.limit)
                gated = {**gated, "limit_grant": self.grants[key].record()}
            started_events = self._started_events(
                base, t, key, hashed_args, invocation, attempt, {**gated, **_timed(spec, t)}
            )
            # (1) T1: acquire + started, durable before the tool may act.
            t1 = (spec, t.name, key, hashed_args, invocation, (*prelude, *started_events))
            row = self._acquire(*t1, started_ids, attempt == 1)
            prelude = ()  # written with the first T1
            if row is not None and row.status == "committed":
                self._release(key)
                return self._recorded_commit(base, row, attempt)
            if row is not None and row.status == "started":
                outcome = resolve_in_flight(self, spec, t, args, key, row, attempt, started_events)
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
            ctx.cancel_asked = self.control.cancel_asked  # (fed by the run's heartbeat)
            t0 = time.perf_counter()
            try_ = _Try(spec, t, ctx, args, base, attempt, invocation, key, t0)
            done, output = self._execute_try(try_, limit)
            if done:
                return output

    def _execute_try(self, try_: _Try, limit: int) -> tuple[bool, Any]:
        """(2) Call the tool, then (3) T2 of its result: ``(True, the result as recorded)``,
        or ``(False, None)`` when the try failed and another is due (its backoff waited out).

        Raises:
            StepFailed: the try failed for good.
        """
        spec, t, attempt = try_.spec, try_.tool, try_.attempt
        returned = False
        try:
            result = self.call(spec, t.fn, try_.ctx, try_.args)
            returned = True
            result_jcs = check_result(spec.node_id, t, result)
        except BaseException as exc:
            if not isinstance(exc, Exception) and not self.retryable(t, exc):
                # KeyboardInterrupt, SystemExit, ...: the run ends as in a crash, the
                # invocation open; a type listed in ``retry_on`` is a failure like any other.
                raise
            if isinstance(exc, CallTimedOut):  # abandoned: its outcome is unknown
                return resolve_timeout(self, try_, exc, limit)
            retryable, error = self._failed_try(try_, exc, returned)
            if isinstance(exc, ToolCancelled) and self.control.cancel_asked.is_set():
                # the tool stopped for the job's cancel request (its failure is recorded):
                # the job ends cancelled, as at the store's refusal of a new step
                raise CancelRequestedError(str(exc), job_id=self.job_id) from exc
            if retryable and attempt < limit:
                self.backoff(attempt)
                return False, None
            raise StepFailed(spec.node_id, error) from exc
        crash.crash_point("tool.after_execute")
        # (3) T2: finished + committed + node_finished, and the ledger row, together.
        output = self._committed_try(try_, result, result_jcs)
        crash.crash_point("tool.after_commit")
        return True, output

    def _acquire(
        self,
        spec: StepSpec,
        tool_name: str,
        key: str,
        hashed_args: str,
        invocation: str,
        started_events: tuple[Item, ...],
        started_ids: list[str],
        presumed_new: bool,
    ) -> LedgerRow | None:
        """T1 of one try (:func:`affidavit.runtime._ledger_steps.acquire`), durable, counted
        by what the ledger decided. Returns the row found instead of inserted (``None`` when
        the insert won)."""
        # A step the log has never started has no ledger row: the insert is presumed new
        # (PostgreSQL sends it unanswered, T1 in one round trip); if a row was there after all,
        # nothing was written and T1 runs again reading it.
        t1 = (self, spec, tool_name, key, hashed_args, invocation, started_events, started_ids)
        try:
            row = self.journal.tx_retrying(True, acquire, *t1, presumed_new)
        except LedgerRowExists:
            row = self.journal.tx_retrying(True, acquire, *t1, False)
        self.metrics.ledger_decisions.inc(
            "allow_execute"
            if row is None or row.status == "failed"
            else "return_recorded_result"
            if row.status == "committed"
            else "in_flight"
        )
        return row

    def _started_events(
        self,
        base: dict[str, Any],
        t: Tool,
        key: str,
        hashed_args: str,
        invocation: str,
        attempt: int,
        gated: dict[str, Any],
    ) -> tuple[Item, Item]:
        """T1's events of one try: ``node_started`` and ``tool_invocation_started``."""
        return (
            (
                "node_started",
                {**base, "attempt": attempt, "worker_id": self.journal.claim.worker_id},
            ),
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

    def _recorded_commit(self, base: dict[str, Any], row: LedgerRow, attempt: int) -> Any:
        """The result of a step whose ledger row is committed, as recorded (read back from the
        ledger), without calling the tool."""
        # The log is the authority and already holds the commit (T2 is atomic); this only
        # records the node's completion if a crash came between T2 and nothing.
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
        if self.cipher is not None and is_sealed(row.result):
            return self.cipher.open(row.result)
        return row.result

    def _committed_try(self, try_: _Try, result: Any, result_jcs: bytes) -> Any:
        """T2 of a try whose call returned a recordable result; returns it as recorded."""
        return commit(
            self,
            durable=False,
            spec=try_.spec,
            key=try_.key,
            invocation=try_.invocation,
            result=result,
            attempt=try_.attempt,
            t0=try_.t0,
            ctx=try_.ctx,
            catch_up=False,
            result_jcs=result_jcs,
        )

    def _failed_try(
        self, try_: _Try, exc: BaseException, returned: bool
    ) -> tuple[bool, dict[str, Any]]:
        """Record a try that raised (``returned``: the tool returned a result that cannot be
        recorded) and run the compensation of a compensatable failure. Returns whether the
        failure is worth another try, and its recorded error.

        Raises:
            StepFailed: a compensatable failure (after its compensation ran).
        """
        t, base, node_id = try_.tool, try_.base, try_.spec.node_id
        # A result that cannot be recorded is never retried, whatever ``retry_on`` says: the
        # tool returned, so it acted, and another try would act again.
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
                    "invocation_id": try_.invocation,
                    "idempotency_key": try_.key,
                    "outcome": "failure",  # (a timeout of the call itself: _timeouts.py)
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
                    "attempt": try_.attempt,
                    "duration_ms": elapsed_ms(try_.t0),
                },
            ),
        )
        self.journal.tx_retrying(False, record_failure, self, try_.key, finished, error)
        self.grants.pop(try_.key, None)
        if isinstance(exc, CompensatableError):
            compensate(self, try_.spec, t, try_.ctx, try_.args, base, try_.attempt)
            raise StepFailed(node_id, error) from exc
        return retryable, error

    def reconcile(
        self, spec: StepSpec, t: Tool, args: dict[str, Any], key: str, row: LedgerRow, attempt: int
    ) -> tuple[tuple[Any] | None, dict[str, Any] | None]:
        """Ask ``t``'s reconcile hook about the invocation a dead attempt left open (see
        :func:`affidavit.runtime._in_flight.reconcile`)."""
        return reconcile(self, spec, t, args, key, row, attempt)

    def count_usage(self, ctx: ToolContext) -> None:
        """Before a step's record: count what it spent (so that a call admitted meanwhile, by
        another thread of the run, is checked against it; a record that then fails counts
        anyway, which errs on the side of the budget)."""
        if ctx.usage and self.on_usage is not None:
            self.on_usage(ctx.usage)

    def _release(self, key: str) -> None:
        """Give back the grant of a limited call that ends without running the tool."""
        self.give_back(self.grants.pop(key, None))

    def give_back(self, grant: Grant | None) -> None:
        """End ``grant`` in a transaction of its own (a limited pure step after its record, a
        limited call that ends without running the tool)."""
        if grant is not None:
            with self.journal.store.transaction(durable=False) as tx:
                release_in(tx, grant)

    # --- pure ---------------------------------------------------------------------------------

    def run_pure(
        self, spec: StepSpec, args: dict[str, Any], *, prelude: tuple[Item, ...] = ()
    ) -> Any:
        """Run a pure step (retried under the policy) and return its output as recorded (see
        :func:`affidavit.runtime._pure_steps.run_pure`).

        Raises:
            StepFailed: the step failed for good.
        """
        return run_pure(self, spec, args, prelude=prelude)

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
        return run_wait(
            self,
            spec,
            correlation_key=correlation_key,
            wait_type=wait_type,
            reason=reason,
            extra=extra,
            wake_at=wake_at,
            prelude=prelude,
        )

    # --- calls, retries -----------------------------------------------------------------------

    def call(
        self,
        spec: StepSpec,
        fn: Callable[..., Any],
        ctx: ToolContext,
        args: dict[str, Any],
        prelude: tuple[Item, ...] = (),
    ) -> Any:
        """Call ``fn`` (a tool, a pure function, a reconcile hook or a compensation) for the
        step (see :func:`affidavit.runtime._step_calls.call_step`), with the job's stream open
        to it until it returns; ``prelude``: the events still to be written with the step's
        record (see :meth:`unwritten`)."""
        ctx.stream = self.stream.for_step(spec.node_id, spec.step_id, ctx.attempt, prelude)
        try:
            return call_step(spec, fn, ctx, args)
        finally:
            if ctx.stream is not None:
                ctx.stream.close()

    @staticmethod
    def unwritten(ctx: ToolContext, prelude: tuple[Item, ...]) -> tuple[Item, ...]:
        """``prelude``, or nothing when the step's stream wrote it with its first value."""
        return () if ctx.stream is not None and ctx.stream.prelude_written else prelude

    def backoff_delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt``: the policy's backoff, doubled per
        attempt, at most a minute."""
        return backoff_delay(self.policy.backoff, attempt)

    def wait_out_backoff(self, node_id: str) -> None:
        """Before a step's first try in this run, wait what is left of the backoff an earlier
        run recorded (see :func:`affidavit.runtime._step_calls.backoff_left`)."""
        left = backoff_left(self.replay, self.policy.backoff, node_id)
        if left is not None:
            self.backoff(*left)

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
