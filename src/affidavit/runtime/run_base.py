"""The state of one run of one job, and the writes every kind of step shares.

Every write appends at the run's known version and is fenced by the claim's attempt id, so a
run that lost its lease (or raced another writer) writes nothing. The run also knows its log's
chain head (it wrote the last event, or read it when it claimed the job), so an append chains
from it without reading it back; the store still refuses the append if anyone else wrote in
between. Version and head advance only when a transaction commits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson

from affidavit.core.canonical import canonical, sha256_hex
from affidavit.core.errors import CanonicalizationError
from affidavit.core.events import utc_now
from affidavit.core.ids import new_event_ids
from affidavit.core.plan import Node, Plan
from affidavit.runtime.metrics import RuntimeMetrics
from affidavit.runtime.replay import ReplayContext
from affidavit.runtime.sdk import Tool, ToolContext, ToolRegistry
from affidavit.runtime.sealing import Sealer
from affidavit.store import Store


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim (lease) of a job by a worker."""

    job_id: str
    attempt_id: str
    worker_id: str
    lease_expires_at: float | None = None  # as the claim wrote it (seconds since the epoch)


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


def error_dict(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc)[:2000]}


# A payload the runner builds for a step holds only ids, names, counters, booleans, a duration
# and already-canonical values wrapped in orjson.Fragment. For those, orjson with sorted keys
# writes exactly the JCS bytes (core.canonical's fast path: strings, integers within ±(2^53-1),
# non-integral doubles from 1e-4 up, ASCII keys), so the walk that checks arbitrary values is
# skipped. Tests re-canonicalize every payload such runs store.
_STEP_PAYLOAD = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER

Item = tuple[str, dict[str, Any]]


def step_payload(payload: dict[str, Any]) -> bytes:
    """The JCS bytes of a payload built by the runner (see above)."""
    try:
        return orjson.dumps(payload, option=_STEP_PAYLOAD)
    except orjson.JSONEncodeError as exc:  # a lone surrogate in a name, say
        raise CanonicalizationError(f"a step event cannot be recorded: {exc}") from None


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
    ) -> None:
        self.store = store
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
        stored = tx.append_encoded(
            self.claim.job_id,
            encoded,
            expected_version=self.version,
            fence=self.claim.attempt_id,
            head=self.head,
        )
        self.version = stored[-1].version
        self.head = bytes.fromhex(stored[-1].chain_hash)
        for event_type, payload in items:
            if event_type == "node_finished":
                node_type = self.plan.node(payload["node_id"]).type
                self.metrics.steps.inc(node_type, payload["result_type"])

    def _write(self, *items: Item, durable: bool = False, fast: bool = False) -> None:
        with self._tx(durable=durable) as tx:
            self._append(tx, *items, fast=fast)

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
        with self._tx(durable=True) as tx:
            self._append(tx, ("job_parked", parked))
            tx.update_job(self.claim.job_id, status="parked", fence=self.claim.attempt_id)
            tx.set_lease(self.claim.job_id, attempt_id=None, owner=None, expires_at=None)
        return Stop("parked")

    def _fail_job(self, node_id: str | None, error: dict[str, Any]) -> None:
        with self._tx(durable=True) as tx:
            self._append(tx, ("job_failed", {"error": error, "node_id": node_id}))
            tx.update_job(
                self.claim.job_id, status="failed", error=error, fence=self.claim.attempt_id
            )
            self.sealer.seal_txn(tx, self.claim.job_id)

    def _check_lease(self) -> None:
        if self.lease_lost is not None and self.lease_lost.is_set():
            raise Stop("lost")

    def _check_stopping(self) -> None:
        """At a step boundary (no invocation of this run open): end the run as ``released`` if
        the worker is stopping; the worker then gives the job's lease back."""
        if self.stopping is not None and self.stopping.is_set():
            raise Stop("released")

    def _confirm_lease(self) -> None:
        """Before the run acts on the world (calls a tool or a compensation): stop unless the
        lease is surely still this run's (:meth:`~affidavit.runtime.lease.Lease.confirm`)."""
        self._check_lease()
        if self.confirm_lease is not None and not self.confirm_lease():
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
    ) -> None:
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
        with self._tx(durable=tx_durable) as tx:
            self._append(tx, *items, fast=True)
            tx.ledger_finish(
                self.claim.job_id, key, status="committed", result=result, result_jcs=jcs
            )


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
        except BaseException:
            run.version, run.head = self._saved
            raise
        finally:
            run._lock.release()


def check_result(node: Node, t: Tool, value: Any) -> bytes:
    """A result is recorded as canonical JSON: its bytes; if it cannot be, say which node
    returned it."""
    try:
        return canonical(value)
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
