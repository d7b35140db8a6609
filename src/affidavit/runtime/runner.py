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

import functools
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Any

import orjson

from affidavit.core.errors import AffidavitError, FencedError, StoreUnavailable
from affidavit.core.ids import new_event_ids
from affidavit.core.plan import Node, external_key, idempotency_key_of
from affidavit.runtime.crash import crash_point
from affidavit.runtime.inflight import RecoveryMixin
from affidavit.runtime.lease import Lease
from affidavit.runtime.metrics import RuntimeMetrics
from affidavit.runtime.replay import ReplayContextBuilder
from affidavit.runtime.run_base import (
    DEFAULT_MAX_RECOVERIES,
    DEFAULT_STORE_RETRY_SECONDS,
    Claim,
    Item,
    Outage,
    StepFailed,
    Stop,
    StopAwareSleep,
    check_lease,
    check_result,
    elapsed_ms,
    error_dict,
    log,
    recorded,
)
from affidavit.runtime.sdk import (
    CompensatableError,
    RetryableError,
    Tool,
    ToolCallError,
    ToolContext,
    ToolRegistry,
)
from affidavit.runtime.sealing import Sealer
from affidavit.runtime.submit import missing_tools
from affidavit.store import Store, StoredEvent
from affidavit.store._ledger import LedgerRow

# The longest single wait of a concurrent step's backoff, between looks at the run's end.
_BACKOFF_SLICE = 0.1
# the error of an approval answered with {"approved": false}
_NOT_APPROVED = {"type": "not_approved", "message": "approval was denied"}


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
        :attr:`missing_tools`)."""
        try:
            events = self._read_log(claim)
        except Stop as stop:
            return stop.status
        builder = ReplayContextBuilder()
        for event in events:
            builder.add(event)
        if builder.plan is None:
            raise AffidavitError(f"job {claim.job_id} has no plan_generated event")
        replay = builder.ctx
        # A job that needs tools this worker does not have is handed back untouched, for a
        # worker that has them (a worker started without its --tools must not fail jobs).
        self.missing_tools = missing_tools(builder.plan, self.tools, replay.completed_nodes)
        if self.missing_tools:
            return "unrunnable"
        run = _Run(
            self.store,
            self.tools,
            claim,
            builder.plan,
            replay,
            len(events),
            bytes.fromhex(events[-1].chain_hash) if events else b"",
            sleep=self._sleep,
            lease_lost=self._lease_lost,
            confirm_lease=self._lease.confirm if self._lease is not None else None,
            metrics=self.metrics,
            sealer=self.sealer,
            stopping=self._stopping,
            store_retry_seconds=self.store_retry_seconds,
        )
        run.step_concurrency = self.step_concurrency
        try:
            if claim.recovered:
                run.count_recovery(events, self.max_recoveries)
            return run.execute()
        except FencedError:
            return "lost"
        except Stop as stop:
            return stop.status

    def _read_log(self, claim: Claim) -> list[StoredEvent]:
        """The job's log, read again while the database is unavailable (for up to
        ``store_retry_seconds``, as the run's writes are): a run that gave up here would
        leave the job claimed until its lease expired."""
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


class _Run(RecoveryMixin):
    """Executes the graph of one run."""

    def count_recovery(self, events: list[StoredEvent], limit: int) -> None:
        """This run recovers a job whose run before ended without finishing or handing it
        back: count it — one more in a row when no node finished since the recovery before
        (the runs between recorded no step's outcome), else the first — and park the job
        instead of running it once the count passes ``limit``.

        Raises:
            Stop: parked (reason ``crash_loop``).
        """
        progress = sum(1 for e in events if e.type == "node_finished")
        claim = self.claim
        count = claim.recoveries + 1 if claim.progress == progress else 1
        if count > limit:
            raise self._park_crash_loop(count, limit)
        self._tx_retrying(
            False, lambda tx: tx.set_recoveries(claim.job_id, claim.attempt_id, count, progress)
        )

    def _park_crash_loop(self, runs: int, limit: int) -> Stop:
        """Park the job: its last ``runs`` runs each ended without finishing or handing it
        back, and without a step's outcome. Named: the node the next run would start with (an
        invocation left open first). Returns the :class:`Stop` to raise."""
        completed = self.replay.completed_nodes
        pending = [s["node_id"] for s in self.replay.pending_tool_invocations.values()]
        ready = [
            n
            for n in self.plan.order
            if n not in completed and completed.issuperset(self.plan.node(n).depends_on)
        ]
        node_id = next(iter(pending + ready), None)
        where = f"inside step {node_id!r}" if node_id else "while finishing the job"
        # (every step completed: the runs died finishing the job; the park names the last node)
        named = node_id or self.plan.order[-1]
        return self._park(
            "crash_loop",
            node_id=named,
            step_id=self.steps[named],
            detail={
                "recoveries": runs,
                "max_recoveries": limit,
                "message": f"the job's last {runs} runs ended without finishing or handing "
                f"it back, and no step recorded an outcome: the worker was killed (out of "
                f"memory?), exited {where}, or lost the lease (frozen, or too busy to renew "
                "it: a longer --lease-seconds helps); parked so that it does not take down "
                "every worker",
            },
        )

    def execute(self) -> str:
        recorded = self._recorded_failure()
        if recorded is not None:
            self._catch_up_open()
            self._fail_job(*recorded)
            return "failed"
        completed = self.replay.completed_nodes
        self._confirm_recorded(completed)
        try:
            if self.step_concurrency > 1:
                self._execute_concurrently(completed)
            else:
                for node_id in self._open_first(self.plan.order):
                    if node_id in completed:
                        continue  # recorded: its output is injected, it is never run again
                    self._check_stopping()
                    self._check_lease()
                    self.scope[node_id] = self._run_node(node_id)
        except StepFailed as failed:
            self._fail_job(failed.node_id, failed.error)
            return "failed"
        crash_point("job.before_complete")
        output = {sink: self.scope.get(sink) for sink in self.plan.sinks()}

        def complete(tx: Any) -> None:
            self._append(tx, ("job_completed", {"output": output}))
            tx.update_job(
                self.claim.job_id, status="completed", output=output, fence=self.claim.attempt_id
            )
            # (the log as the run leaves it: job_completed is its last event)
            self.sealer.seal_txn(tx, self.claim.job_id, head=(self.version, self.head.hex()))

        self._tx_retrying(True, complete)
        return "completed"

    def _run_node(self, node_id: str) -> Any:
        """Run one node whose dependencies completed; its output."""
        node = self.plan.node(node_id)
        try:
            if node.type == "tool":
                return self._tool_step(node)
            if node.type == "pure":
                return self._pure_step(node)
            return self._wait_step(node)
        except (Exception, KeyboardInterrupt):
            raise
        except BaseException as exc:  # SystemExit from a tool, say: the run ends as a crash
            log.error(
                "job %s: step %r raised %s, which ends the run as a crash would: the job is "
                "recovered when its lease expires (and parked as crash_loop if it keeps "
                "happening); a tool should raise an Exception instead",
                self.claim.job_id,
                node_id,
                ascii(exc) if str(exc) else type(exc).__name__,
            )
            raise

    def _execute_concurrently(self, completed: set[str]) -> None:
        """Run independent nodes at the same time, up to ``step_concurrency`` at once.

        Every step keeps the tool-step protocol (its transactions are serialized by the run's
        lock; only the tools' own work overlaps). Whatever ends the run — a failed step, a wait,
        a park, a lost lease — takes effect only after the steps already running have finished
        and recorded their outcome, so no recorded effect is ever cut off (a step whose try
        failed retryably starts no new one then: see :meth:`_backoff`). Invocations a dead
        attempt left open are resolved first, one at a time (they may park or fail the job), and
        wait/approval nodes run only when no other step is running.
        """
        done = set(completed)
        remaining = [n for n in self.plan.order if n not in done]
        opened = self._open_nodes()
        for node_id in self._open_first([n for n in remaining if n in opened]):
            self._check_stopping()
            self._check_lease()
            self.scope[node_id] = self._run_node(node_id)
            done.add(node_id)
            remaining.remove(node_id)
        ended: BaseException | None = None
        running: dict[Future[Any], str] = {}
        with ThreadPoolExecutor(self.step_concurrency, thread_name_prefix="affidavit-step") as pool:
            try:
                while True:
                    progressed = True
                    if ended is None and self.stopping is not None and self.stopping.is_set():
                        ended = Stop("released")  # start nothing more; let the running steps end
                    while ended is None and progressed:
                        progressed = False
                        for node_id in list(remaining):
                            if len(running) >= self.step_concurrency:
                                break
                            node = self.plan.node(node_id)
                            if not all(d in done for d in node.depends_on):
                                continue
                            if node.type in ("wait", "approval"):
                                if running:
                                    continue  # a wait ends the run: let the running steps finish
                                remaining.remove(node_id)
                                self._check_lease()
                                self.scope[node_id] = self._run_node(node_id)
                                done.add(node_id)
                                progressed = True
                                break
                            remaining.remove(node_id)
                            self._check_lease()
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
                            self.ending.set()  # the others start no new try
            finally:
                self.ending.set()  # whatever ended the loop: the steps still running end too
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
            t = self.tools.get(self.plan.node(node_id).tool or "")
            return t is None or t.reconcile_fn is None

        first = sorted((n for n in order if n in opened), key=unreconcilable)  # stable
        return first + [n for n in order if n not in opened]

    def _tool(self, node: Node, kind: str) -> Tool:
        found = self.tools.get(node.tool or "")
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

    @staticmethod
    def _retryable(t: Tool, exc: BaseException) -> bool:
        if isinstance(exc, ToolCallError):  # fails before the function runs, every time
            return False
        return isinstance(exc, RetryableError | TimeoutError) or (
            bool(t.retry_on) and isinstance(exc, t.retry_on)
        )

    def _backoff_delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt``: the policy's backoff, doubled per
        attempt, at most a minute."""
        # (2**1024 is past any float; by 2**1000 any backoff above 1e-299 s is at the cap)
        return min(self.backoff * 2.0 ** min(attempt - 1, 1000), 60.0)

    def _backoff_left(self, node: Node) -> None:
        """Before a step's first try in this run: when its last try, recorded by an earlier
        run (one that stopped or died in the backoff), failed retryably and no try started
        since, wait what is left of that backoff — measured from the failure's recorded time —
        so that handing a job over does not hit a rate-limited service again at once."""
        last = self.replay.node_finished.get(node.id)
        if (
            self.backoff <= 0
            or last is None
            or last.get("result_type") != "retryable_failure"
            or self.replay.node_attempts.get(node.id) != last.get("attempt")
        ):
            return
        try:
            failed_at = datetime.fromisoformat(str(last["at"])).timestamp()
        except (KeyError, ValueError):
            return  # (the log's shape was checked by the replay; a time it cannot read: no wait)
        delay = self._backoff_delay(int(last["attempt"]))
        # (another worker's clock may be ahead: never more than the backoff itself)
        self._backoff(int(last["attempt"]), min(delay, failed_at + delay - time.time()))

    def _backoff(self, attempt: int, delay: float | None = None) -> None:
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
            delay = self._backoff_delay(attempt) if self.backoff > 0 else 0.0
        if delay > 0:
            lost = self.lease_lost

            def over() -> bool:  # the worker stops, the run ends, or the lease is lost
                return self._ending() or (lost is not None and lost.is_set())

            if isinstance(self.sleep, StopAwareSleep):  # the worker's own wait
                self.sleep(delay, over)
            elif self.step_concurrency == 1:
                self.sleep(delay)
            else:  # in slices, so that the run's end cuts it
                while delay > 0 and not over():
                    self.sleep(min(delay, _BACKOFF_SLICE))
                    delay -= _BACKOFF_SLICE
            self._check_lease()
        self._check_stopping()

    # --- pure ---------------------------------------------------------------------------------

    def _pure_step(self, node: Node) -> Any:
        t = self._tool(node, "pure")
        args, _ = self._resolve_args(node)
        step = self.steps[node.id]
        attempt = self.replay.node_attempts.get(node.id, 0)
        limit = t.retry or self.max_attempts
        self._backoff_left(node)
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
            ctx.close(f"pure step {node.id!r} changes nothing outside")
            t0 = time.perf_counter()
            try:
                output = self._call(node, t.fn, ctx, args)
                output_jcs = check_result(node, t, output)
            except Exception as exc:
                retry = self._retryable(t, exc) and attempt < limit
                finished = {
                    "node_id": node.id,
                    "step_id": step,
                    "attempt": attempt,
                    "result_type": "retryable_failure"
                    if self._retryable(t, exc)
                    else "permanent_failure",
                    "error": error_dict(exc),
                    "duration_ms": elapsed_ms(t0),
                }
                self._write(("node_started", started), ("node_finished", finished))
                if retry:
                    self._backoff(attempt)
                    continue
                raise StepFailed(node.id, error_dict(exc)) from exc
            crash_point("pure.after_execute")
            finished = {
                "node_id": node.id,
                "step_id": step,
                "attempt": attempt,
                "result_type": "pure",
                "output": orjson.Fragment(output_jcs),
                "duration_ms": elapsed_ms(t0),
            }
            self._write(("node_started", started), ("node_finished", finished), fast=True)
            return recorded(output_jcs)

    # --- wait / approval (continued by signals) -------------------------------------------------

    def _wait_step(self, node: Node) -> Any:
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
                finished["error"] = dict(_NOT_APPROVED)
            self._write(("node_finished", finished))
            if not approved:
                # (the error recorded: a recovery that ends the job from the log says the same)
                raise StepFailed(node.id, dict(_NOT_APPROVED))
            return payload
        if key not in self.replay.waits:

            def record_wait(tx: Any) -> None:
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

            self._tx_retrying(True, record_wait)
        raise Stop("waiting")

    # --- tool -----------------------------------------------------------------------------------

    def _acquire(
        self,
        tx: Any,
        node: Node,
        step: str,
        tool_name: str,
        key: str,
        hashed_args: str,
        invocation: str,
        started_events: tuple[Item, Item],
        started_ids: list[str],
    ) -> LedgerRow | None:
        """T1's writes: the ledger row only one attempt can win, and the started events when
        this attempt may execute. Returns the row found instead of inserted (``None`` when the
        insert won)."""
        job_id = self.claim.job_id
        # The insert comes first: on the usual path (a key never seen) it is the only ledger
        # statement of T1.
        inserted = tx.ledger_insert(
            job_id=job_id,
            key=key,
            node_id=node.id,
            step_id=step,
            tool_name=tool_name,
            args_hash=hashed_args,
            invocation_id=invocation,
            attempt_id=self.claim.attempt_id,
        )
        row: LedgerRow | None = None if inserted else tx.ledger_get(job_id, key)
        if row is None:
            self._append(tx, *started_events, fast=True, ids=started_ids)
        elif row.status == "failed":
            tx.ledger_restart(
                job_id, key, invocation_id=invocation, attempt_id=self.claim.attempt_id
            )
            self._append(tx, *started_events, fast=True)
        return row

    def _record_failure(
        self, tx: Any, key: str, items: tuple[Item, Item], error: dict[str, Any]
    ) -> None:
        """A failed attempt's T2: its finished events, and its ledger row marked failed (so a
        retry may run the tool again)."""
        self._append(tx, *items)
        tx.ledger_finish(self.claim.job_id, key, status="failed", error=error)

    def _tool_step(self, node: Node) -> Any:
        t = self._tool(node, "tool")
        args, args_jcs = self._resolve_args(node)
        step = self.steps[node.id]
        job_id = self.claim.job_id
        key = idempotency_key_of(job_id, step, t.name, args_jcs)
        hashed_args = hashlib.sha256(args_jcs).hexdigest()[:16]  # = args_hash(args)
        attempt = self.replay.node_attempts.get(node.id, 0)
        limit = t.retry or self.max_attempts
        base = {"node_id": node.id, "step_id": step}
        self._backoff_left(node)
        while True:
            attempt += 1
            # the invocation id and the ids of T1's two events, in one call
            invocation, *started_ids = new_event_ids(3)
            started_events: tuple[Item, Item] = (
                ("node_started", {**base, "attempt": attempt, "worker_id": self.claim.worker_id}),
                (
                    "tool_invocation_started",
                    {
                        **base,
                        "invocation_id": invocation,
                        "tool_name": t.name,
                        "idempotency_key": key,
                        "args_hash": hashed_args,
                        "attempt": attempt,
                    },
                ),
            )
            # (1) T1: acquire + started, durable before the tool may act.
            row = self._tx_retrying(
                True,
                self._acquire,
                node,
                step,
                t.name,
                key,
                hashed_args,
                invocation,
                started_events,
                started_ids,
            )
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
                return committed
            if row is not None and row.status == "started":
                outcome = self._in_flight(node, t, args, key, row, attempt, started_events)
                if outcome is not None:
                    return outcome[0]
                # not found by reconcile: the dead invocation is closed and ours is started
                invocation = str(started_events[1][1]["invocation_id"])
            crash_point("tool.after_acquire")
            # The lease may have been taken over while T1 committed, or may have run out while
            # this process was frozen: then do not act. The invocation stays open for the new
            # owner, whose reconcile (or in-flight policy) decides — never a second blind
            # execution from here.
            self._confirm_lease()
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
            returned = False
            try:
                result = self._call(node, t.fn, ctx, args)
                returned = True
                result_jcs = check_result(node, t, result)
            except BaseException as exc:
                if not isinstance(exc, Exception) and not self._retryable(t, exc):
                    # KeyboardInterrupt, SystemExit, ...: the run ends as in a crash, the
                    # invocation open; a type listed in ``retry_on`` is a failure like any other.
                    raise
                # A result that cannot be recorded is never retried, whatever ``retry_on``
                # says: the tool returned, so it acted, and another try would act again.
                retryable = not returned and self._retryable(t, exc)
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

                self._tx_retrying(False, self._record_failure, key, finished, error)
                if isinstance(exc, CompensatableError):
                    self._compensate(node, t, ctx, args, base, attempt)
                    raise StepFailed(node.id, error) from exc
                if retryable and attempt < limit:
                    self._backoff(attempt)
                    continue
                raise StepFailed(node.id, error) from exc
            crash_point("tool.after_execute")
            # (3) T2: finished + committed + node_finished, and the ledger row, together.
            output = self._commit(
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
                result_jcs=result_jcs,
            )
            crash_point("tool.after_commit")
            return output
