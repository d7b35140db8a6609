"""The state of one run of one job, and the writes every kind of step shares.

Every write appends at the run's known version and is fenced by the claim's attempt id, so a
run that lost its lease (or raced another writer) writes nothing. The run also knows its log's
chain head (it wrote the last event, or read it when it claimed the job), so an append chains
from it without reading it back; the store still refuses the append if anyone else wrote in
between. Version and head advance only when a transaction commits.
"""

from __future__ import annotations

import copy
import inspect
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import orjson

from affidavit.core.canonical import canonical, canonical_nested, parse, sha256_hex
from affidavit.core.errors import AffidavitError, CanonicalizationError, StoreUnavailable
from affidavit.core.events import utc_now
from affidavit.core.ids import new_event_ids
from affidavit.core.plan import Node, Plan
from affidavit.runtime.args import resolve
from affidavit.runtime.metrics import RuntimeMetrics
from affidavit.runtime.replay import ReplayContext
from affidavit.runtime.sdk import Tool, ToolCallError, ToolContext, ToolRegistry
from affidavit.runtime.sealing import Sealer
from affidavit.store import Store

# How long a run keeps trying a write while the database is unavailable (a restart, a
# failover, a lock held past the busy timeout), and the waits between tries.
DEFAULT_STORE_RETRY_SECONDS = 60.0
# Recoveries in a row without progress after which a job is parked (reason crash_loop)
# instead of being run again: a step that kills its worker (out of memory, sys.exit, a crash in
# native code) would otherwise take down every worker that picks the job up, for ever.
DEFAULT_MAX_RECOVERIES = 5
_RETRY_FIRST_WAIT = 0.05
_RETRY_MAX_WAIT = 1.0

T = TypeVar("T")
log = logging.getLogger("affidavit.runner")


class Outage:
    """A run's waits while the database is unavailable: 50 ms, doubling up to 1 s, for up to
    ``retry_seconds`` after the first failure. ``check_lease`` raises :class:`Stop` when a
    heartbeat found the lease taken (no use waiting then)."""

    __slots__ = ("_check_lease", "_job_id", "_retry_seconds", "_started", "_wait")

    def __init__(self, job_id: str, retry_seconds: float, check_lease: Callable[[], None]) -> None:
        self._job_id = job_id
        self._retry_seconds = retry_seconds
        self._check_lease = check_lease
        self._started: float | None = None
        self._wait = _RETRY_FIRST_WAIT

    def wait(self, exc: StoreUnavailable, doing: str) -> bool:
        """Log ``exc`` and wait before the next try; ``False`` (no wait) once the run has
        tried for ``retry_seconds``.

        Raises:
            Stop: ``"lost"``, when a heartbeat found the lease taken.
        """
        now = time.monotonic()
        self._started = now if self._started is None else self._started
        if now - self._started >= self._retry_seconds:
            log.error(
                "job %s: the database stayed unavailable for %.0f s; giving up %s: %s",
                self._job_id,
                now - self._started,
                doing,
                exc,
            )
            return False
        (log.warning if self._wait == _RETRY_FIRST_WAIT else log.debug)(
            "job %s: the database is unavailable (%s); %s, for up to %.0f s",
            self._job_id,
            exc,
            doing,
            self._retry_seconds,
        )
        self._check_lease()
        time.sleep(self._wait)  # not cut short by a stop: the step's record is what it awaits
        self._wait = min(self._wait * 2, _RETRY_MAX_WAIT)
        return True


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim (lease) of a job by a worker."""

    job_id: str
    attempt_id: str
    worker_id: str
    lease_expires_at: float | None = None  # as the claim wrote it (seconds since the epoch)
    # the lease had expired with an owner, and what the recoveries before recorded (see
    # affidavit.store._ledger.Claimed)
    recovered: bool = False
    recoveries: int = 0
    progress: int | None = None


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


class StopAwareSleep:
    """A worker's own wait between a step's tries: cut short when the worker is asked to stop
    and, given ``over``, as soon as it says so (the run ends, or a heartbeat found the lease
    lost: the job was cancelled or taken over, and the next try could write nothing)."""

    __slots__ = ("_stopping",)
    _SLICE = 0.1  # how often ``over`` is asked

    def __init__(self, stopping: threading.Event) -> None:
        self._stopping = stopping

    def __call__(self, seconds: float, over: Callable[[], bool] | None = None) -> None:
        if over is None:
            self._stopping.wait(seconds)
            return
        end = time.monotonic() + seconds
        while not over() and not self._stopping.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return
            self._stopping.wait(min(left, self._SLICE))


def check_lease(lease_lost: threading.Event | None) -> None:
    """Stop the run (``"lost"``) when a heartbeat found its lease taken."""
    if lease_lost is not None and lease_lost.is_set():
        raise Stop("lost")


def error_dict(exc: BaseException) -> dict[str, Any]:
    """A step's error as recorded. It must always be recordable: a failure that cannot be
    written leaves its step to run again on every pickup. So a message that is not valid
    Unicode (a lone surrogate, from a file name decoded with ``surrogateescape`` say) is
    escaped, and one that cannot be read at all is named as such."""
    try:
        message = str(exc)[:2000]
    except Exception:
        message = "(the exception's message could not be read)"
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"type": type(exc).__name__, "message": message}


# A payload the runner builds for a step holds only ids, names, counters, booleans, a duration
# and already-canonical values wrapped in orjson.Fragment. For those, orjson with sorted keys
# writes exactly the JCS bytes (core.canonical's fast path: strings, integers within ±(2^53-1),
# non-integral doubles from 1e-4 up, ASCII keys), so the walk that checks arbitrary values is
# skipped. Tests re-canonicalize every payload such runs store.
_STEP_PAYLOAD = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER

Item = tuple[str, dict[str, Any]]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def unfit_call(
    node: Node, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
) -> ToolCallError | None:
    """Why ``fn(ctx, **args)`` raised a ``TypeError`` before ``fn`` ran — its parameters do not
    take the step's context and these arguments — as a :class:`ToolCallError` naming the node,
    the function's parameters and the arguments given; ``None`` when the call fits (the error
    came from within the function) or the function's parameters cannot be read."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins and callables)
        return None
    try:
        signature.bind(ctx, **args)
    except TypeError as exc:
        reason = str(exc)
    else:
        return None
    name = getattr(fn, "__name__", None) or repr(fn)
    params = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    shown = signature.replace(parameters=params, return_annotation=signature.empty)
    message = (
        f"step {node.id!r}: {name}{shown} cannot be called as {name}(ctx, **args) with "
        f"args ({', '.join(args) or 'none'}): {reason}"
    )
    first = params[0] if params else None
    if first is None or first.kind not in (*_POSITIONAL, inspect.Parameter.VAR_POSITIONAL):
        message += "; its first parameter must take the step's context"
    elif first.name in args and first.kind in _POSITIONAL:
        message += (
            f"; the first parameter takes the step's context: def {name}(ctx, {first.name}, ...)"
        )
    return ToolCallError(message)


def step_payload(payload: dict[str, Any]) -> bytes:
    """The JCS bytes of a payload built by the runner (see above)."""
    try:
        return orjson.dumps(payload, option=_STEP_PAYLOAD)
    except orjson.JSONEncodeError as exc:  # a lone surrogate in a name, say
        raise CanonicalizationError(f"a step event cannot be recorded: {exc}") from None


_SCALARS = frozenset({str, int, float, bool, type(None)})


def own_args(args: dict[str, Any]) -> dict[str, Any]:
    """A copy of resolved args for one call: what the callee changes in place changes nothing
    else (they share objects with the input and upstream outputs). Args of scalars only — the
    usual case — need no deep copy."""
    for value in args.values():
        if type(value) not in _SCALARS:
            return copy.deepcopy(args)
    return dict(args)


def open_closings(
    tx: Any, job_id: str, error: dict[str, Any], *, skip: str | None = None
) -> list[Item]:
    """The events that close every invocation still open in the ledger (begun, never
    finished) — ``tool_invocation_finished`` as ``lost``, ``catch_up`` (the tool may or may not
    have acted) — for a transaction that ends the job, so that it ends with no key pending
    (FORMATS.md §3). Reads only. ``skip``: a key the caller closes itself."""
    return [
        (
            "tool_invocation_finished",
            {
                "node_id": row.node_id,
                "step_id": row.step_id,
                "invocation_id": row.invocation_id,
                "idempotency_key": row.idempotency_key,
                "outcome": "lost",
                "catch_up": True,
                "error": error,
            },
        )
        for row in tx.ledger_open(job_id)
        if row.idempotency_key != skip
    ]


def fail_closed(tx: Any, job_id: str, closings: list[Item], error: dict[str, Any]) -> None:
    """Mark the ledger rows of ``closings`` (see :func:`open_closings`) failed with ``error``.
    Called once the job's row is locked (its events appended, on PostgreSQL), so that every
    writer takes the job's lock before its ledger rows' and none waits on another in a cycle."""
    for _, payload in closings:
        tx.ledger_finish(job_id, payload["idempotency_key"], status="failed", error=error)


def close_open_invocations(
    tx: Any, job_id: str, error: dict[str, Any], *, skip: str | None = None
) -> list[Item]:
    """:func:`open_closings`, with their ledger rows marked failed at once: for a transaction
    that has locked the job's row already (a person's decision), which appends the returned
    events before the job's last event."""
    closings = open_closings(tx, job_id, error, skip=skip)
    fail_closed(tx, job_id, closings, error)
    return closings


class RunBase:
    """One run of one job (one claim)."""

    def __init__(
        self,
        store: Store,
        tools: ToolRegistry,
        claim: Claim,
        plan: Plan,
        replay: ReplayContext,
        version: int,
        head: bytes,
        *,
        sleep: Callable[[float], None],
        lease_lost: threading.Event | None,
        metrics: RuntimeMetrics,
        sealer: Sealer,
        confirm_lease: Callable[[], bool] | None = None,
        stopping: threading.Event | None = None,
        store_retry_seconds: float = DEFAULT_STORE_RETRY_SECONDS,
    ) -> None:
        self.store = store
        self.store_retry_seconds = store_retry_seconds
        # (version, head, finished steps) a run transaction that failed at its commit would
        # have left had the commit landed
        self._attempted: tuple[int, bytes, tuple[tuple[str, str], ...]] | None = None
        # (node type, result type) of the node_finished events of the open transaction
        self._finished_steps: list[tuple[str, str]] = []
        self.metrics = metrics
        self.sealer = sealer  # signs the seal in the transaction of the terminal event
        # Steps of one run may execute concurrently (step_concurrency > 1); their transactions
        # and the run's known version are serialized by this lock.
        self._lock = threading.RLock()
        self.step_concurrency = 1
        self.tools = tools
        self.sleep = sleep
        self.lease_lost = lease_lost
        self.confirm_lease = confirm_lease
        # set when the worker is asked to stop: the run ends at the next step boundary
        self.stopping = stopping
        # set, in a run of concurrent steps, once something ends the run (a step's failure, a
        # lost lease): the steps still running record their outcome but start no new try
        self.ending = threading.Event()
        self.claim = claim
        self.plan = plan
        self.replay = replay
        self.version = version
        self.head = head  # raw H_version
        # the replay derived them from this plan when it read plan_generated
        self.steps = (
            replay.step_ids
            if replay.job_id == claim.job_id and replay.step_ids
            else plan.step_ids(claim.job_id)
        )
        policy = replay.policy or plan.policy.to_dict()
        self.in_flight_policy: str = policy["in_flight"]
        self.max_attempts: int = policy["retry"]["max_attempts"]
        self.backoff: float = policy["retry"]["backoff_seconds"]
        self.replay_verification: str = policy.get("replay_verification", "strict")
        self.scope: dict[str, Any] = {"input": replay.input}
        for node_id in replay.completed_nodes:
            self.scope[node_id] = replay.node_output(node_id)

    # --- writing ------------------------------------------------------------------------------

    def _tx(self, *, durable: bool) -> AbstractContextManager[Any]:
        """A store transaction, exclusive among the run's concurrently executing steps. The
        run's version and head are restored if it does not commit."""
        return _RunTransaction(self, durable)

    def _tx_retrying(self, durable: bool, body: Callable[..., T], *args: Any) -> T:
        """``body(tx, *args)`` in a run transaction, tried again while the database is unavailable
        (:class:`StoreUnavailable`) for up to ``store_retry_seconds``, so that a restart or a
        failover of the database does not cut a step between its tool call and its record.

        A commit reported as failed may have landed (the connection broke after the server
        committed). Before trying again, the job's head is compared with the head that
        commit would have made — the chain hash covers this run's new event ids, so only
        that commit can have made it — and a commit that landed is taken as done, with the
        result its body returned: nothing is written twice. Otherwise ``body`` runs again in
        a new transaction, fenced as always, so a run whose lease was taken meanwhile writes
        nothing (:class:`FencedError`).

        Raises:
            StoreUnavailable: the database stayed unavailable for ``store_retry_seconds``.
            Stop: ``"lost"``, when a heartbeat found the lease taken while waiting.
        """
        # The run's lock is held throughout, so that the concurrent steps of this run do not
        # write in between a commit whose outcome is unknown and the check of its head.
        with self._lock:
            job_id = self.claim.job_id
            outage: Outage | None = None  # made at the first failure: none on the usual path
            # a commit that may have landed: what it would have left, and what its body returned
            unknown: tuple[tuple[int, bytes, tuple[tuple[str, str], ...]], T] | None = None
            while True:
                body_returned = False
                try:
                    if unknown is not None:
                        ((version, head, steps), returned) = unknown
                        with self._tx(durable=False) as tx:
                            landed = tx.head(job_id) == (version, head)
                        unknown = None
                        if landed:
                            self.version, self.head = version, head
                            for node_type, result_type in steps:
                                self.metrics.steps.inc(node_type, result_type)
                            self.metrics.store_retries.inc("landed")
                            log.info("job %s: a commit reported as failed had landed", job_id)
                            return returned
                    self._attempted = None
                    with self._tx(durable=durable) as tx:
                        result = body(tx, *args)
                        body_returned = True
                    return result
                except StoreUnavailable as exc:
                    attempted, self._attempted = self._attempted, None
                    if body_returned and attempted is not None:
                        unknown = (attempted, result)  # failed at the commit: landed or not
                    outage = outage or self._outage()
                    if not outage.wait(exc, "trying the write again"):
                        self.metrics.store_retries.inc("gave_up")
                        raise
                    self.metrics.store_retries.inc("retried")

    def _append(
        self, tx: Any, *items: Item, fast: bool = False, ids: list[str] | None = None
    ) -> None:
        """Append events (``at`` added). ``fast``: every payload is one the runner built for a
        step (see :func:`step_payload`); otherwise each is canonicalized in full. ``ids``: the
        events' ids, made by the caller (:func:`~affidavit.core.ids.new_event_ids`) together
        with other ids it needs; new ones otherwise."""
        at = utc_now()
        encode = step_payload if fast else canonical
        encoded = [
            (event_id, event_type, encode({**payload, "at": at}))
            for event_id, (event_type, payload) in zip(
                ids if ids is not None else new_event_ids(len(items)), items, strict=True
            )
        ]
        self.head = tx.append_known_head(
            self.claim.job_id,
            encoded,
            expected_version=self.version,
            fence=self.claim.attempt_id,
            head=self.head,
        )
        self.version += len(encoded)
        for event_type, payload in items:
            if event_type == "node_finished":  # counted when the transaction commits
                node_type = self.plan.node(payload["node_id"]).type
                self._finished_steps.append((node_type, payload["result_type"]))

    def _append_items(self, tx: Any, items: tuple[Item, ...], fast: bool) -> None:
        self._append(tx, *items, fast=fast)

    def _write(self, *items: Item, durable: bool = False, fast: bool = False) -> None:
        self._tx_retrying(durable, self._append_items, items, fast)

    def _park(
        self,
        reason: str,
        *,
        node_id: str,
        step_id: str,
        detail: dict[str, Any],
        idempotency_key: str | None = None,
    ) -> Stop:
        """Park the job (a person decides with ``affidavit resume``): it holds no lease and
        no worker until then. Returns the :class:`Stop` to raise."""
        parked: dict[str, Any] = {"reason": reason, "node_id": node_id, "step_id": step_id}
        if idempotency_key is not None:
            parked["idempotency_key"] = idempotency_key
        parked["detail"] = detail

        def write(tx: Any) -> None:
            self._append(tx, ("job_parked", parked))
            tx.update_job(self.claim.job_id, status="parked", fence=self.claim.attempt_id)
            tx.set_lease(self.claim.job_id, attempt_id=None, owner=None, expires_at=None)

        self._tx_retrying(True, write)
        return Stop("parked")

    def _fail_job(self, node_id: str | None, error: dict[str, Any]) -> None:
        """Fail the job with ``error``; invocations still open are closed first (see
        :meth:`_close_open`)."""

        def write(tx: Any) -> None:
            self._close_open(tx)
            self._append(tx, ("job_failed", {"error": error, "node_id": node_id}))
            tx.update_job(
                self.claim.job_id, status="failed", error=error, fence=self.claim.attempt_id
            )
            # (the log as the run leaves it: job_failed is its last event)
            self.sealer.seal_txn(tx, self.claim.job_id, head=(self.version, self.head.hex()))

        self._tx_retrying(True, write)

    def _resolve_args(self, node: Node) -> tuple[dict[str, Any], bytes]:
        """The node's arguments resolved, and their canonical bytes (keys are derived from
        them, so they are encoded once)."""
        try:
            resolved = resolve(dict(node.args), self.scope, node.id)
            encoded = canonical(resolved)
        except AffidavitError as exc:
            raise StepFailed(node.id, {"type": exc.code, "message": exc.message}) from exc
        return resolved, encoded

    def _close_open(self, tx: Any, keep: str | None = None) -> None:
        """In a transaction that ends the job: close every invocation still open (one a dead
        attempt started and this run never resolved); see :func:`open_closings`.
        ``keep``: a key the caller closes itself."""
        error = {
            "type": "lost",
            "message": "the job ended while this invocation was open; "
            "the tool may or may not have acted",
        }
        closings = open_closings(tx, self.claim.job_id, error, skip=keep)
        if closings:
            self._append(tx, *closings)  # the job's row first, then its ledger rows
            fail_closed(tx, self.claim.job_id, closings, error)

    def _check_lease(self) -> None:
        check_lease(self.lease_lost)

    def _outage(self) -> Outage:
        return Outage(self.claim.job_id, self.store_retry_seconds, self._check_lease)

    def _check_stopping(self) -> None:
        """At a step boundary (no invocation of this run open): end the run as ``released`` if
        the worker is stopping; the worker then gives the job's lease back. In a run of
        concurrent steps that is ending already (:attr:`ending`), end this step here too: what
        ends the run decides its outcome, not this."""
        if self._ending():
            raise Stop("released")

    def _ending(self) -> bool:
        """Whether the worker is stopping or (concurrent steps) the run is ending."""
        return self.ending.is_set() or (self.stopping is not None and self.stopping.is_set())

    def _confirm_lease(self) -> None:
        """Before the run acts on the world (calls a tool or a compensation): stop unless the
        lease is surely still this run's (:meth:`~affidavit.runtime.lease.Lease.confirm`).
        While the database is unavailable for the renewal this needs, ask again (as
        :meth:`_tx_retrying` does), so that an outage right after T1 does not leave an
        invocation open that never ran."""
        self._check_lease()
        if self.confirm_lease is None:
            return
        outage: Outage | None = None
        while True:
            try:
                if self.confirm_lease():
                    return
                break
            except StoreUnavailable as exc:
                outage = outage or self._outage()
                if not outage.wait(exc, "confirming the lease before the tool is called"):
                    break
        raise Stop("lost")

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
        result_jcs: bytes | None = None,
    ) -> Any:
        """T2 (or a catch-up's commit). Returns the result as recorded — read back from its
        canonical bytes, as a replay reads it — for the steps that take it as their input."""
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
                },
            )
        )

        self._tx_retrying(tx_durable, self._commit_txn, items, key, result, jcs)
        return recorded(jcs)

    def _commit_txn(self, tx: Any, items: list[Item], key: str, result: Any, jcs: bytes) -> None:
        """T2's writes: the step's closing events and its ledger row committed."""
        self._append(tx, *items, fast=True)
        tx.ledger_finish(self.claim.job_id, key, status="committed", result=result, result_jcs=jcs)

    def _call(
        self, node: Node, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
    ) -> Any:
        """Call ``fn`` (a tool, a pure function, a reconcile hook or a compensation) for
        ``node``, within the node's ``timeout_seconds`` if it has one (``TimeoutError``); the
        context records nothing afterwards.
        """
        # Each try gets its own copy: a tool that changes its arguments (or an abandoned
        # timed-out try still running) must not change what a retry, a compensation or a later
        # step sees — the resolved args share objects with the input and upstream outputs.
        args = own_args(args)
        try:
            if node.timeout_seconds is None:
                return fn(ctx, **args)
            return self._call_timed(node, fn, ctx, args)
        except TypeError as exc:
            unfit = unfit_call(node, fn, ctx, args)
            if unfit is None:  # the call fit: the error came from within the function
                raise
            raise unfit from exc
        finally:
            ctx.close(f"step {node.id!r} (attempt {ctx.attempt}) is over")

    @staticmethod
    def _call_timed(
        node: Node, fn: Callable[..., Any], ctx: ToolContext, args: dict[str, Any]
    ) -> Any:
        outcome: Future[Any] = Future()

        def call() -> None:
            try:
                outcome.set_result(fn(ctx, **args))
            except BaseException as exc:
                outcome.set_exception(exc)

        # A daemon thread, not a pool's: the interpreter joins a pool's threads at exit, so a
        # timed-out try that never returns would keep the worker process from ever exiting.
        threading.Thread(target=call, name=f"affidavit-{node.id}", daemon=True).start()
        try:
            return outcome.result(timeout=node.timeout_seconds)
        except FutureTimeout:
            raise TimeoutError(
                f"step {node.id!r} timed out after {node.timeout_seconds}s"
            ) from None


class _RunTransaction:
    """:meth:`RunBase._tx` (a class rather than a generator: every tool step opens two)."""

    __slots__ = ("_inner", "_run", "_saved")

    def __init__(self, run: RunBase, durable: bool) -> None:
        self._run = run
        self._inner = run.store.transaction(durable=durable)

    def __enter__(self) -> Any:
        run = self._run
        run._lock.acquire()
        try:
            # read under the lock: what to restore if this transaction does not commit
            self._saved = (run.version, run.head)
            run._finished_steps.clear()
            return self._inner.__enter__()
        except BaseException:
            run._lock.release()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        run = self._run
        try:
            self._inner.__exit__(exc_type, exc, tb)
            if exc is not None:
                run.version, run.head = self._saved
            else:
                for node_type, result_type in run._finished_steps:
                    run.metrics.steps.inc(node_type, result_type)
        except BaseException:
            if (run.version, run.head) != self._saved:  # the commit failed after appends
                run._attempted = (run.version, run.head, tuple(run._finished_steps))
            run.version, run.head = self._saved
            raise
        finally:
            run._finished_steps.clear()
            run._lock.release()


def recorded(jcs: bytes) -> Any:
    """A step's output or result as the log holds it (``jcs``, its canonical bytes), for the
    steps that take it as their input: exactly what a run that replays the log reads. Not the
    object the function returned: that may change after it was recorded (an object the function
    keeps and changes again, say), and its lookups may differ from the recorded JSON's (a tuple
    is a list once recorded) — either would give the steps after it other args, hence other
    idempotency keys, than a recovery derives, and an invocation in flight would go unseen."""
    return parse(jcs)


def check_result(node: Node, t: Tool, value: Any) -> bytes:
    """A result is recorded as canonical JSON: its bytes; if it cannot be, say which node
    returned it."""
    try:
        return canonical_nested(value)  # (recorded again inside the job's output)
    except CanonicalizationError as exc:
        raise CanonicalizationError(
            f"{t.kind} {t.name!r} of node {node.id!r} returned a value that cannot be "
            f"recorded: {exc.reason}",
            path=exc.path,
            hint=exc.hint,
        ) from exc


def elapsed_ms(t0: float) -> float | int:
    """Milliseconds since ``t0`` to the microsecond; a whole number as an ``int`` (JCS writes
    ``5.0`` as ``5`` either way; this keeps it on the fast encoder's path)."""
    ms = round((time.perf_counter() - t0) * 1000, 3)
    return int(ms) if ms.is_integer() else ms
