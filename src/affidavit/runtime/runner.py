"""Executes one claimed job: the tool-step protocol of ARCHITECTURE.md.

For a tool node (every write fenced by the claim's attempt id):

(1) T1, durable: acquire the ledger row for the idempotency key (an insert only one attempt can
    win) and append ``node_started`` + ``tool_invocation_started``;
(2) execute the tool, only when (1) allowed it;
(3) T2, written (the next durable commit covers it): append ``tool_invocation_finished``,
    ``command_committed``, ``state_changed``, ``node_finished`` and mark the row committed.

A row found ``started`` by a dead attempt is in flight: the tool's ``reconcile`` decides, else
the plan's (or tool's) ``in_flight`` policy parks or fails the job. A committed row is never
executed again, and a finished pure step is never re-run: the replay context injects both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.core.errors import AffidavitError, CanonicalizationError, FencedError
from affidavit.core.events import utc_now
from affidavit.core.ids import new_event_id
from affidavit.core.plan import Node, Plan, args_hash, external_key, idempotency_key
from affidavit.runtime.args import resolve
from affidavit.runtime.crash import crash_point
from affidavit.runtime.replay import ReplayContext, build_from_events
from affidavit.runtime.sdk import (
    CompensatableError,
    RetryableError,
    Tool,
    ToolContext,
    ToolRegistry,
)
from affidavit.store import NewEvent, Store
from affidavit.store._ledger import LedgerRow


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim (lease) of a job by a worker."""

    job_id: str
    attempt_id: str
    worker_id: str


class StepFailed(Exception):
    """A node failed for good; the job fails with ``error``."""

    def __init__(self, node_id: str, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.node_id = node_id
        self.error = error


class Stop(Exception):
    """The run ends without completing: the job is waiting, parked, or the lease was lost."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def _error(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc)[:2000]}


class JobRunner:
    """Runs claimed jobs against a store and a tool registry."""

    def __init__(
        self,
        store: Store,
        tools: ToolRegistry,
        *,
        sleep: Callable[[float], None] = time.sleep,
        lease_lost: threading.Event | None = None,
    ) -> None:
        self.store = store
        self.tools = tools
        self._sleep = sleep
        self._lease_lost = lease_lost

    # --- the job --------------------------------------------------------------------------

    def run(self, claim: Claim) -> str:
        """Run the job of ``claim`` until it completes, fails, waits, parks or loses its
        lease; return the resulting status (``"lost"`` when fenced off)."""
        events = self.store.list_events(claim.job_id)
        replay = build_from_events(events)
        if replay.task_graph is None:
            raise AffidavitError(f"job {claim.job_id} has no plan_generated event")
        run = _Run(self, claim, Plan.parse(replay.task_graph), replay, len(events))
        try:
            return run.execute()
        except FencedError:
            return "lost"
        except Stop as stop:
            return stop.status


class _Run:
    """The state of one run of one job (one claim)."""

    def __init__(
        self, runner: JobRunner, claim: Claim, plan: Plan, replay: ReplayContext, version: int
    ) -> None:
        self.r = runner
        self.store = runner.store
        self.claim = claim
        self.plan = plan
        self.replay = replay
        self.version = version
        self.steps = plan.step_ids(claim.job_id)
        policy = replay.policy or plan.policy.to_dict()
        self.in_flight_policy: str = policy["in_flight"]
        self.max_attempts: int = policy["retry"]["max_attempts"]
        self.backoff: float = policy["retry"]["backoff_seconds"]
        self.scope: dict[str, Any] = {"input": replay.input}
        for node_id in replay.completed_nodes:
            self.scope[node_id] = replay.node_output(node_id)

    # --- writing ------------------------------------------------------------------------------

    def _events(self, *items: tuple[str, dict[str, Any]]) -> list[NewEvent]:
        at = utc_now()
        return [NewEvent(t, {**p, "at": at}) for t, p in items]

    def _append(self, tx: Any, *items: tuple[str, dict[str, Any]]) -> None:
        stored = tx.append(
            self.claim.job_id,
            self._events(*items),
            expected_version=self.version,
            fence=self.claim.attempt_id,
        )
        self.version += len(stored)

    def _write(self, *items: tuple[str, dict[str, Any]], durable: bool = False) -> None:
        with self.store.transaction(durable=durable) as tx:
            self._append(tx, *items)

    def _check_lease(self) -> None:
        if self.r._lease_lost is not None and self.r._lease_lost.is_set():
            raise Stop("lost")

    # --- the graph ----------------------------------------------------------------------------

    def execute(self) -> str:
        completed = self.replay.completed_nodes
        for node_id in self.plan.order:
            if node_id in completed:
                continue  # recorded: its output is injected, it is never run again
            self._check_lease()
            node = self.plan.node(node_id)
            try:
                if node.type == "tool":
                    self.scope[node_id] = self._tool_step(node)
                elif node.type == "pure":
                    self.scope[node_id] = self._pure_step(node)
                else:
                    self._wait_step(node)
            except StepFailed as failed:
                self._fail_job(failed.node_id, failed.error)
                return "failed"
        crash_point("job.before_complete")
        output = {sink: self.scope.get(sink) for sink in self.plan.sinks()}
        with self.store.transaction(durable=True) as tx:
            self._append(tx, ("job_completed", {"output": output}))
            tx.update_job(
                self.claim.job_id, status="completed", output=output, fence=self.claim.attempt_id
            )
        return "completed"

    def _fail_job(self, node_id: str | None, error: dict[str, Any]) -> None:
        with self.store.transaction(durable=True) as tx:
            self._append(tx, ("job_failed", {"error": error, "node_id": node_id}))
            tx.update_job(
                self.claim.job_id, status="failed", error=error, fence=self.claim.attempt_id
            )

    def _resolve_args(self, node: Node) -> dict[str, Any]:
        try:
            resolved = resolve(dict(node.args), self.scope, node.id)
            canonical(resolved)
        except AffidavitError as exc:
            raise StepFailed(node.id, {"type": exc.code, "message": exc.message}) from exc
        return resolved  # type: ignore[no-any-return]

    def _tool(self, node: Node, kind: str) -> Tool:
        found = self.r.tools.get(node.tool or "")
        if found is None or found.kind != kind:
            raise StepFailed(
                node.id,
                {
                    "type": "tool_not_registered",
                    "message": f"{kind} {node.tool!r} of node {node.id!r} is not registered "
                    "in this worker",
                },
            )
        return found

    def _call(
        self, node: Node, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
    ) -> Any:
        if node.timeout_seconds is None:
            return fn(ctx, **args)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"affidavit-{node.id}")
        try:
            return pool.submit(fn, ctx, **args).result(timeout=node.timeout_seconds)
        except FutureTimeout:
            raise TimeoutError(
                f"step {node.id!r} timed out after {node.timeout_seconds}s"
            ) from None
        finally:
            pool.shutdown(wait=False)

    @staticmethod
    def _retryable(t: Tool, exc: BaseException) -> bool:
        return isinstance(exc, RetryableError | TimeoutError) or (
            bool(t.retry_on) and isinstance(exc, t.retry_on)
        )

    def _backoff(self, attempt: int) -> None:
        if self.backoff > 0:
            self.r._sleep(min(self.backoff * 2 ** (attempt - 1), 60.0))

    # --- pure ---------------------------------------------------------------------------------

    def _pure_step(self, node: Node) -> Any:
        t = self._tool(node, "pure")
        args = self._resolve_args(node)
        step = self.steps[node.id]
        attempt = self.replay.node_attempts.get(node.id, 0)
        limit = t.retry or self.max_attempts
        while True:
            attempt += 1
            started = {
                "node_id": node.id,
                "step_id": step,
                "attempt": attempt,
                "worker_id": self.claim.worker_id,
            }
            ctx = ToolContext(
                self.claim.job_id,
                node.id,
                step,
                attempt,
                None,
                external_key(self.claim.job_id, step, self.claim.attempt_id),
            )
            t0 = time.perf_counter()
            try:
                output = self._call(node, t.fn, ctx, args)
                _check_result(node, t, output)
            except Exception as exc:
                retry = self._retryable(t, exc) and attempt < limit
                finished = {
                    "node_id": node.id,
                    "step_id": step,
                    "attempt": attempt,
                    "result_type": "retryable_failure"
                    if self._retryable(t, exc)
                    else "permanent_failure",
                    "error": _error(exc),
                    "duration_ms": _ms(t0),
                }
                self._write(("node_started", started), ("node_finished", finished))
                if retry:
                    self._backoff(attempt)
                    continue
                raise StepFailed(node.id, _error(exc)) from exc
            crash_point("pure.after_execute")
            finished = {
                "node_id": node.id,
                "step_id": step,
                "attempt": attempt,
                "result_type": "pure",
                "output": output,
                "duration_ms": _ms(t0),
            }
            self._write(("node_started", started), ("node_finished", finished))
            return output

    # --- wait / approval (continued by signals) -------------------------------------------------

    def _wait_step(self, node: Node) -> None:
        key = f"{self.claim.job_id}:{node.id}"
        done = self.replay.completed_waits.get(key)
        step = self.steps[node.id]
        if done is not None:
            payload = done.get("payload")
            approved = not (
                node.type == "approval"
                and isinstance(payload, dict)
                and payload.get("approved") is False
            )
            finished = {
                "node_id": node.id,
                "step_id": step,
                "attempt": 1,
                "result_type": "pure" if approved else "permanent_failure",
                "duration_ms": 0,
            }
            if approved:
                finished["output"] = payload
            else:
                finished["error"] = {"type": "not_approved", "message": "approval was denied"}
            self._write(("node_finished", finished))
            if not approved:
                raise StepFailed(node.id, {"type": "not_approved", "message": "approval denied"})
            self.scope[node.id] = payload
            return
        if key not in self.replay.waits:
            with self.store.transaction(durable=True) as tx:
                self._append(
                    tx,
                    (
                        "node_started",
                        {
                            "node_id": node.id,
                            "step_id": step,
                            "attempt": 1,
                            "worker_id": self.claim.worker_id,
                        },
                    ),
                    (
                        "job_waiting",
                        {
                            "node_id": node.id,
                            "wait_type": "approval" if node.type == "approval" else "signal",
                            "correlation_key": key,
                            "reason": f"{node.type} node {node.id!r}",
                        },
                    ),
                )
                tx.update_job(self.claim.job_id, status="waiting", fence=self.claim.attempt_id)
                tx.set_lease(self.claim.job_id, attempt_id=None, owner=None, expires_at=None)
        raise Stop("waiting")

    # --- tool -----------------------------------------------------------------------------------

    def _tool_step(self, node: Node) -> Any:
        t = self._tool(node, "tool")
        args = self._resolve_args(node)
        step = self.steps[node.id]
        job_id = self.claim.job_id
        key = idempotency_key(job_id, step, t.name, args)
        attempt = self.replay.node_attempts.get(node.id, 0)
        limit = t.retry or self.max_attempts
        base = {"node_id": node.id, "step_id": step}
        while True:
            attempt += 1
            invocation = new_event_id()
            started_events = (
                ("node_started", {**base, "attempt": attempt, "worker_id": self.claim.worker_id}),
                (
                    "tool_invocation_started",
                    {
                        **base,
                        "invocation_id": invocation,
                        "tool_name": t.name,
                        "idempotency_key": key,
                        "args_hash": args_hash(args),
                        "attempt": attempt,
                    },
                ),
            )
            # (1) T1: acquire + started, durable before the tool may act.
            with self.store.transaction(durable=True) as tx:
                row = tx.ledger_get(job_id, key)
                if row is None:
                    tx.ledger_insert(
                        job_id=job_id,
                        key=key,
                        node_id=node.id,
                        step_id=step,
                        tool_name=t.name,
                        args_hash=args_hash(args),
                        invocation_id=invocation,
                        attempt_id=self.claim.attempt_id,
                    )
                    self._append(tx, *started_events)
                elif row.status == "committed":
                    recorded = row.result
                elif row.status == "failed":
                    tx.ledger_restart(
                        job_id, key, invocation_id=invocation, attempt_id=self.claim.attempt_id
                    )
                    self._append(tx, *started_events)
            if row is not None and row.status == "committed":
                # The log is the authority and already holds the commit (T2 is atomic); this
                # only records the node's completion if a crash came between T2 and nothing.
                self._write(
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
                return recorded
            if row is not None and row.status == "started":
                outcome = self._in_flight(node, t, args, key, row, attempt, started_events)
                if outcome is not None:
                    return outcome[0]
                # not found by reconcile: the dead invocation is closed and ours is started
                invocation = str(started_events[1][1]["invocation_id"])
            crash_point("tool.after_acquire")
            # (2) execute
            ctx = ToolContext(
                job_id,
                node.id,
                step,
                attempt,
                key,
                external_key(job_id, step, self.claim.attempt_id),
            )
            t0 = time.perf_counter()
            try:
                result = self._call(node, t.fn, ctx, args)
                _check_result(node, t, result)
            except Exception as exc:
                retryable = self._retryable(t, exc)
                result_type = (
                    "compensatable_failure"
                    if isinstance(exc, CompensatableError)
                    else "retryable_failure"
                    if retryable
                    else "permanent_failure"
                )
                with self.store.transaction(durable=False) as tx:
                    self._append(
                        tx,
                        (
                            "tool_invocation_finished",
                            {
                                **base,
                                "invocation_id": invocation,
                                "idempotency_key": key,
                                "outcome": "timeout"
                                if isinstance(exc, TimeoutError)
                                else "failure",
                                "error": _error(exc),
                                "catch_up": False,
                            },
                        ),
                        (
                            "node_finished",
                            {
                                **base,
                                "result_type": result_type,
                                "error": _error(exc),
                                "attempt": attempt,
                                "duration_ms": _ms(t0),
                            },
                        ),
                    )
                    tx.ledger_finish(job_id, key, status="failed", error=_error(exc))
                if isinstance(exc, CompensatableError):
                    self._compensate(node, t, ctx, args, base, attempt)
                    raise StepFailed(node.id, _error(exc)) from exc
                if retryable and attempt < limit:
                    self._backoff(attempt)
                    continue
                raise StepFailed(node.id, _error(exc)) from exc
            crash_point("tool.after_execute")
            # (3) T2: finished + committed + node_finished, and the ledger row, together.
            self._commit(
                tx_durable=False,
                node=node,
                base=base,
                key=key,
                invocation=invocation,
                result=result,
                attempt=attempt,
                t0=t0,
                ctx=ctx,
                catch_up=False,
            )
            crash_point("tool.after_commit")
            return result

    def _commit(
        self,
        *,
        tx_durable: bool,
        node: Node,
        base: dict[str, Any],
        key: str,
        invocation: str,
        result: Any,
        attempt: int,
        t0: float,
        ctx: ToolContext | None,
        catch_up: bool,
    ) -> None:
        items: list[tuple[str, dict[str, Any]]] = [
            (
                "tool_invocation_finished",
                {
                    **base,
                    "invocation_id": invocation,
                    "idempotency_key": key,
                    "outcome": "success",
                    "result": result,
                    "catch_up": catch_up,
                },
            ),
            (
                "command_committed",
                {
                    **base,
                    "command_id": invocation,
                    "idempotency_key": key,
                    "result_hash": canonical_sha256(result),
                },
            ),
        ]
        if ctx is not None and ctx.state_changes:
            items.append(
                (
                    "state_changed",
                    {**base, "state_changes": [c.to_dict() for c in ctx.state_changes]},
                )
            )
        items.append(
            (
                "node_finished",
                {
                    **base,
                    "result_type": "side_effect_committed",
                    "attempt": attempt,
                    "duration_ms": _ms(t0),
                },
            )
        )
        with self.store.transaction(durable=tx_durable) as tx:
            self._append(tx, *items)
            tx.ledger_finish(self.claim.job_id, key, status="committed", result=result)

    def _compensate(
        self,
        node: Node,
        t: Tool,
        ctx: ToolContext,
        args: dict[str, Any],
        base: dict[str, Any],
        attempt: int,
    ) -> None:
        if t.compensate_fn is None:
            return
        try:
            details = t.compensate_fn(ctx, **args)
            canonical(details)
        except Exception as exc:
            raise StepFailed(
                node.id,
                {
                    "type": "compensation_failed",
                    "message": f"compensation of {node.id!r} failed: {exc}",
                },
            ) from exc
        self._write(
            ("step_compensated", {**base, "compensation": details}),
            (
                "node_finished",
                {
                    **base,
                    "result_type": "compensated",
                    "attempt": attempt,
                    "duration_ms": 0,
                    "output": details,
                },
            ),
        )

    def _in_flight(
        self,
        node: Node,
        t: Tool,
        args: dict[str, Any],
        key: str,
        row: LedgerRow,
        attempt: int,
        started_events: tuple[tuple[str, dict[str, Any]], ...],
    ) -> tuple[Any] | None:
        """Resolve an invocation that a dead attempt started and never finished. Returns
        ``(result,)`` when reconcile found the effect (caught up), ``None`` when it found
        nothing (the dead invocation is closed as lost and ours is started); parks or fails
        the job otherwise (raising)."""
        job_id = self.claim.job_id
        base = {"node_id": node.id, "step_id": row.step_id}
        dead = row.invocation_id
        reconcile_error: dict[str, Any] | None = None
        if t.reconcile_fn is not None:
            ctx = ToolContext(
                job_id,
                node.id,
                row.step_id,
                attempt,
                key,
                external_key(job_id, row.step_id, row.attempt_id),
            )
            t0 = time.perf_counter()
            try:
                found = t.reconcile_fn(ctx, **args)
                if found is not None:
                    _check_result(node, t, found)
            except Exception as exc:  # the lookup itself failed: decide as without a hook
                reconcile_error = _error(exc)
            else:
                if found is not None:
                    self._commit(
                        tx_durable=False,
                        node=node,
                        base=base,
                        key=key,
                        invocation=dead,
                        result=found,
                        attempt=attempt,
                        t0=t0,
                        ctx=ctx,
                        catch_up=True,
                    )
                    return (found,)
                invocation = started_events[1][1]["invocation_id"]
                with self.store.transaction(durable=True) as tx:
                    self._append(
                        tx,
                        (
                            "tool_invocation_finished",
                            {
                                **base,
                                "invocation_id": dead,
                                "idempotency_key": key,
                                "outcome": "lost",
                                "error": {"type": "lost", "message": "reconcile found no effect"},
                                "catch_up": True,
                            },
                        ),
                        *started_events,
                    )
                    tx.ledger_restart(
                        job_id, key, invocation_id=invocation, attempt_id=self.claim.attempt_id
                    )
                return None
        policy = t.in_flight or self.in_flight_policy
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
            with self.store.transaction(durable=True) as tx:
                self._append(
                    tx,
                    (
                        "job_parked",
                        {
                            "reason": "in_flight",
                            "node_id": node.id,
                            "step_id": row.step_id,
                            "idempotency_key": key,
                            "detail": detail,
                        },
                    ),
                )
                tx.update_job(job_id, status="parked", fence=self.claim.attempt_id)
                tx.set_lease(job_id, attempt_id=None, owner=None, expires_at=None)
            raise Stop("parked")
        error = {**detail, "type": "in_flight", "message": "invocation in flight or lost"}
        with self.store.transaction(durable=True) as tx:
            self._append(
                tx,
                (
                    "tool_invocation_finished",
                    {
                        **base,
                        "invocation_id": dead,
                        "idempotency_key": key,
                        "outcome": "lost",
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
                        "attempt": attempt,
                        "duration_ms": 0,
                    },
                ),
                ("job_failed", {"error": error, "node_id": node.id}),
            )
            tx.ledger_finish(job_id, key, status="failed", error=error)
            tx.update_job(job_id, status="failed", error=error, fence=self.claim.attempt_id)
        raise Stop("failed")


def _check_result(node: Node, t: Tool, value: Any) -> None:
    """A result is recorded as canonical JSON; if it cannot be, say which node returned it."""
    try:
        canonical(value)
    except CanonicalizationError as exc:
        raise CanonicalizationError(
            f"{t.kind} {t.name!r} of node {node.id!r} returned a value that cannot be "
            f"recorded: {exc.reason}",
            path=exc.path,
            hint=exc.hint,
        ) from exc


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
