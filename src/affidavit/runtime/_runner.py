"""Runs claimed jobs: reads the log, rebuilds the job's state, and hands each step to the
step executor (:mod:`affidavit.runtime._step_executor`, the tool-step protocol) in the job's
order — a plan's canonical topological order here, an agent function's program order in
:mod:`affidavit.runtime._agent_runner`. What to do about the past first (recorded failures,
confirmation replay, invocations left open, crash loops) is :mod:`affidavit.runtime._recovery`'s.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from affidavit.core import crash
from affidavit.core.approvals import ApprovalPolicy
from affidavit.core.canonical import canonical
from affidavit.core.errors import (
    AffidavitError,
    CancelRequestedError,
    FencedError,
    StoreUnavailable,
)
from affidavit.core.plan import Node, Plan
from affidavit.record import ReplayContext, ReplayContextBuilder, Sealer, opened_payload, resolve
from affidavit.runtime._cancel import end_cancelled
from affidavit.runtime._children import run_job_node
from affidavit.runtime._journal import Journal, RunControl
from affidavit.runtime._lease import Lease
from affidavit.runtime._metrics import RuntimeMetrics
from affidavit.runtime._recovery import Recovery
from affidavit.runtime._run_base import (
    DEFAULT_MAX_RECOVERIES,
    DEFAULT_STORE_RETRY_SECONDS,
    Claim,
    Outage,
    StepFailed,
    Stop,
    check_lease,
    log,
)
from affidavit.runtime._sdk import ToolRegistry
from affidavit.runtime._step_executor import StepExecutor, StepPolicy, StepSpec
from affidavit.runtime._submit import missing_tools
from affidavit.store import Store, StoredEvent


@dataclass(frozen=True, slots=True)
class RunParts:
    """The collaborators of one run: what ends it, what it writes through, what runs a step."""

    control: RunControl
    journal: Journal
    executor: StepExecutor
    policy: StepPolicy
    tools: ToolRegistry
    metrics: RuntimeMetrics


class JobRunner:
    """Runs claimed jobs against a store and a tool registry."""

    def __init__(
        self,
        store: Store,
        tools: ToolRegistry,
        *,
        sleep: Callable[[float], None] = time.sleep,
        lease_lost: threading.Event | None = None,
        metrics: RuntimeMetrics | None = None,
        step_concurrency: int = 1,
        sealer: Sealer | None = None,
        lease: Lease | None = None,
        stopping: threading.Event | None = None,
        store_retry_seconds: float = DEFAULT_STORE_RETRY_SECONDS,
        max_recoveries: int = DEFAULT_MAX_RECOVERIES,
    ) -> None:
        if step_concurrency < 1:
            raise ValueError("step_concurrency must be ≥ 1")
        self.max_recoveries = max_recoveries
        self.on_step: Callable[[str, int], None] | None = None  # see Worker.on_step
        if store_retry_seconds < 0:
            raise ValueError("store_retry_seconds must not be negative")
        # how long a run keeps trying a write while the database is unavailable
        self.store_retry_seconds = store_retry_seconds
        self.store = store
        self.sealer = sealer if sealer is not None else Sealer.for_store(store)
        self.tools = tools
        self.step_concurrency = step_concurrency
        self._sleep = sleep
        # ``lease``: the claim's lease, confirmed before every tool call; ``lease_lost`` alone
        # only says whether a heartbeat found it lost
        self._lease = lease
        self._lease_lost = lease_lost if lease_lost is not None or lease is None else lease.lost
        self.metrics = metrics if metrics is not None else RuntimeMetrics()
        # ``stopping``: once set, the run ends at its next step boundary as "released"
        self._stopping = stopping
        self.missing_tools: list[str] = []  # after run() returned "unrunnable"

    # --- the job --------------------------------------------------------------------------

    def run(self, claim: Claim) -> str:
        """Run the job of ``claim`` until it completes, fails, waits, parks or loses its
        lease; return the resulting status (``"lost"`` when fenced off, ``"released"`` when
        it stopped at a step boundary because the worker is stopping, ``"unrunnable"`` —
        nothing written — when its remaining nodes need tools this runner lacks, listed in
        :attr:`missing_tools`). A job that failed has its child jobs that have not ended
        cancelled (:func:`~affidavit.runtime._cancel.cancel_children_of_failed`)."""
        status = self._run(claim)
        if status == "failed":
            from affidavit.runtime._cancel import cancel_children_of_failed

            cancel_children_of_failed(self.store, claim.job_id, sealer=self.sealer)
        return status

    def _run(self, claim: Claim) -> str:
        try:
            events = self._read_log(claim)
        except Stop as stop:
            return stop.status
        cipher = self.store.writer_cipher(claim.job_id)  # a subject's job: its values open
        builder = ReplayContextBuilder()
        for event in events:
            builder.add(event, None if cipher is None else opened_payload(event, cipher))
        replay = builder.ctx
        if builder.agent is not None:
            from affidavit.runtime._agent_runner import run_agent_job

            return run_agent_job(self, claim, events, replay, builder.agent)
        if builder.plan is None:
            raise AffidavitError(f"job {claim.job_id} has no plan_generated event")
        plan = builder.plan
        # A job that needs tools this worker does not have is handed back untouched, for a
        # worker that has them (a worker started without its --tools must not fail jobs).
        self.missing_tools = missing_tools(plan, self.tools, replay.completed_nodes)
        if self.missing_tools:
            return "unrunnable"
        parts = self.run_parts(
            claim,
            events,
            replay,
            replay.policy or plan.policy.to_dict(),
            lambda node_id: plan.node(node_id).type,
        )
        run = PlanRun(parts, plan, replay)
        try:
            if claim.recovered:
                run.count_recovery(events, self.max_recoveries)
            return run.execute()
        except FencedError:
            return "lost"
        except CancelRequestedError:  # the store started nothing new: the job ends cancelled
            return end_cancelled(parts.journal)
        except Stop as stop:
            return stop.status

    def run_parts(
        self,
        claim: Claim,
        events: list[StoredEvent],
        replay: ReplayContext,
        policy: dict[str, Any],
        node_type: Callable[[str], str],
    ) -> RunParts:
        """The collaborators of one run of ``claim``'s job, whose log is ``events``."""
        control = RunControl(
            claim.job_id,
            lease_lost=self._lease_lost,
            confirm_lease=self._lease.confirm if self._lease is not None else None,
            stopping=self._stopping,
            store_retry_seconds=self.store_retry_seconds,
            cancel_asked=self._lease.cancel_asked if self._lease is not None else None,
        )
        journal = Journal(
            self.store,
            claim,
            [bytes.fromhex(event.chain_hash) for event in events],
            control=control,
            metrics=self.metrics,
            sealer=self.sealer,
            node_type=node_type,
        )
        journal.on_step = self.on_step
        step_policy = StepPolicy.of(policy)
        executor = StepExecutor(
            journal,
            self.tools,
            replay,
            step_policy,
            control=control,
            metrics=self.metrics,
            sleep=self._sleep,
            step_concurrency=self.step_concurrency,
        )
        return RunParts(control, journal, executor, step_policy, self.tools, self.metrics)

    def _read_log(self, claim: Claim) -> list[StoredEvent]:
        """The job's log, read again while the database is unavailable (for up to
        ``store_retry_seconds``, as the run's writes are): a run that gave up here would
        leave the job claimed until its lease expired. (Not read again if the claim read it.)"""
        if claim.log is not None:
            return list(claim.log)
        outage: Outage | None = None
        while True:
            try:
                return self.store.list_events(claim.job_id)
            except StoreUnavailable as exc:
                if outage is None:
                    lost = functools.partial(check_lease, self._lease_lost)
                    outage = Outage(claim.job_id, self.store_retry_seconds, lost)
                if not outage.wait(exc, "reading the log to start the run"):
                    raise


class PlanRun:
    """One run of a plan job: decides which node runs next and asks the step executor to run
    it. The steps it knows (:class:`~affidavit.runtime._recovery.StepSource`) are the plan's."""

    def __init__(self, parts: RunParts, plan: Plan, replay: ReplayContext) -> None:
        self.parts = parts
        self.control = parts.control
        self.journal = parts.journal
        self.executor = parts.executor
        self.plan = plan
        self.replay = replay
        job_id = parts.journal.job_id
        # the replay derived them from this plan when it read plan_generated
        self.steps = (
            replay.step_ids
            if replay.job_id == job_id and replay.step_ids
            else plan.step_ids(job_id)
        )
        self.scope: dict[str, Any] = {"input": replay.input}
        for node_id in replay.completed_nodes:
            self.scope[node_id] = replay.node_output(node_id)
        self.recovery = Recovery(
            parts.journal, parts.executor, self, replay, parts.tools, parts.policy, parts.metrics
        )

    # --- StepSource ---------------------------------------------------------------------------

    def step_order(self) -> Sequence[str]:
        return self.plan.order

    def spec(self, node_id: str) -> StepSpec:
        node = self.plan.node(node_id)
        return StepSpec(node.id, self.steps[node.id], node.type, node.tool, node.timeout_seconds)

    def step_args(self, node_id: str) -> dict[str, Any]:
        return self._resolve_args(self.plan.node(node_id))[0]

    # --- the run ------------------------------------------------------------------------------

    def count_recovery(self, events: list[StoredEvent], limit: int) -> None:
        """See :meth:`Recovery.count_recovery`; the park names the node the next run would
        start with (an invocation left open first)."""
        completed = self.replay.completed_nodes
        pending = [s["node_id"] for s in self.replay.pending_tool_invocations.values()]
        ready = [
            n
            for n in self.plan.order
            if n not in completed and completed.issuperset(self.plan.node(n).depends_on)
        ]
        next_node = next(iter(pending + ready), None)
        # (every step completed: the runs died finishing the job; the park names the last node)
        self.recovery.count_recovery(events, limit, next_node, self.plan.order[-1])

    def execute(self) -> str:
        if self.recovery.fail_recorded():
            return "failed"
        completed = self.replay.completed_nodes
        self.recovery.confirm_recorded(completed)
        try:
            if self.executor.step_concurrency > 1:
                self._execute_concurrently(completed)
            else:
                for node_id in self._open_first(self.plan.order):
                    if node_id in completed:
                        continue  # recorded: its output is injected, it is never run again
                    self.control.check_stopping()
                    self.control.check_lease()
                    self.scope[node_id] = self._run_node(node_id)
        except StepFailed as failed:
            self.journal.fail_job(failed.node_id, failed.error)
            return "failed"
        crash.crash_point("job.before_complete")
        self.journal.complete({sink: self.scope.get(sink) for sink in self.plan.sinks()})
        return "completed"

    def _run_node(self, node_id: str) -> Any:
        """Run one node whose dependencies completed; its output."""
        node = self.plan.node(node_id)
        spec = self.spec(node_id)
        try:
            if node.type == "tool":
                self.executor.tool_of(spec)
                args, args_jcs = self._resolve_args(node)
                return self.executor.run_tool(spec, args, args_jcs)
            if node.type == "pure":
                self.executor.tool_of(spec)
                return self.executor.run_pure(spec, self._resolve_args(node)[0])
            if node.type == "job":
                args = self._resolve_args(node)[0]
                return run_job_node(self.journal, self.replay, self.parts.tools, spec, args)
            policy = (
                ApprovalPolicy.parse(node.raw.get("approvers"), node.raw.get("min_approvals"), "")
                if node.type == "approval"
                else None
            )
            return self.executor.run_wait(
                spec,
                correlation_key=f"{self.journal.job_id}:{node.id}",
                wait_type="approval" if node.type == "approval" else "signal",
                reason=f"{node.type} node {node.id!r}",
                extra=policy.to_dict() if policy is not None else None,
            )
        except (Exception, KeyboardInterrupt):
            raise
        except BaseException as exc:  # SystemExit from a tool, say: the run ends as a crash
            log.error(
                "job %s: step %r raised %s, which ends the run as a crash would: the job is "
                "recovered when its lease expires (and parked as crash_loop if it keeps "
                "happening); a tool should raise an Exception instead",
                self.journal.job_id,
                node_id,
                ascii(exc) if str(exc) else type(exc).__name__,
            )
            raise

    def _may_ask(self, node: Node) -> bool:
        """A tool node whose tool may ask for an approval of its call: asking ends the run as a
        wait does, so under step concurrency it runs, as a wait node, only when no other step
        runs."""
        found = self.executor.tools.get(node.tool or "") if node.type == "tool" else None
        return found is not None and bool(found.requires_approval)

    def _resolve_args(self, node: Node) -> tuple[dict[str, Any], bytes]:
        """The node's arguments resolved, and their canonical bytes (keys are derived from
        them, so they are encoded once)."""
        try:
            resolved = resolve(dict(node.args), self.scope, node.id)
            encoded = canonical(resolved)
        except AffidavitError as exc:
            raise StepFailed(node.id, {"type": exc.code, "message": exc.message}) from exc
        return resolved, encoded

    def _execute_concurrently(self, completed: set[str]) -> None:
        """Run independent nodes at the same time, up to ``step_concurrency`` at once.

        Every step keeps the tool-step protocol (its transactions are serialized by the
        journal's lock; only the tools' own work overlaps). Whatever ends the run — a failed
        step, a wait, a park, a lost lease — takes effect only after the steps already running
        have finished and recorded their outcome, so no recorded effect is ever cut off (a step
        whose try failed retryably starts no new one then: see
        :meth:`StepExecutor.backoff`). Invocations a dead attempt left open are resolved first,
        one at a time (they may park or fail the job), and wait/approval nodes run only when no
        other step is running.
        """
        control = self.control
        limit = self.executor.step_concurrency
        done = set(completed)
        remaining = [n for n in self.plan.order if n not in done]
        opened = self._open_nodes()
        for node_id in self._open_first([n for n in remaining if n in opened]):
            control.check_stopping()
            control.check_lease()
            self.scope[node_id] = self._run_node(node_id)
            done.add(node_id)
            remaining.remove(node_id)
        ended: BaseException | None = None
        running: dict[Future[Any], str] = {}
        with ThreadPoolExecutor(limit, thread_name_prefix="affidavit-step") as pool:
            try:
                while True:
                    progressed = True
                    if ended is None and control.stopping is not None and control.stopping.is_set():
                        ended = Stop("released")  # start nothing more; let the running steps end
                    while ended is None and progressed:
                        progressed = False
                        for node_id in list(remaining):
                            if len(running) >= limit:
                                break
                            node = self.plan.node(node_id)
                            if not all(d in done for d in node.depends_on):
                                continue
                            if node.type in ("wait", "approval", "job") or self._may_ask(node):
                                if running:
                                    continue  # a wait ends the run: let the running steps finish
                                remaining.remove(node_id)
                                control.check_lease()
                                self.scope[node_id] = self._run_node(node_id)
                                done.add(node_id)
                                progressed = True
                                break
                            remaining.remove(node_id)
                            control.check_lease()
                            running[pool.submit(self._run_node, node_id)] = node_id
                    if not running:
                        break
                    finished, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in finished:
                        node_id = running.pop(future)
                        try:
                            self.scope[node_id] = future.result()
                            done.add(node_id)
                        except BaseException as exc:  # re-raised once every running step has ended
                            # a step's own outcome (a failure, a park) wins over a worker's stop
                            released = isinstance(ended, Stop) and ended.status == "released"
                            ended = exc if ended is None or released else ended
                            control.ending.set()  # the others start no new try
            finally:
                control.ending.set()  # whatever ended the loop: the steps still running end too
        if ended is not None:
            raise ended

    def _open_nodes(self) -> set[str]:
        return {p["node_id"] for p in self.replay.pending_tool_invocations.values()}

    def _open_first(self, order: Sequence[str]) -> list[str]:
        """``order`` with the nodes a dead attempt left in flight first — those whose tool has
        a ``reconcile`` hook before those without — so that every invocation that can be
        resolved without a person is resolved before the run parks (or fails) on one that
        cannot. (An open node's dependencies completed before it started, so it may go first.)"""
        opened = self._open_nodes()
        if not opened:
            return list(order)

        def unreconcilable(node_id: str) -> bool:
            t = self.parts.tools.get(self.plan.node(node_id).tool or "")
            return t is None or t.reconcile_fn is None

        first = sorted((n for n in order if n in opened), key=unreconcilable)  # stable
        return first + [n for n in order if n not in opened]
