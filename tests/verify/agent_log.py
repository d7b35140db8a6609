"""Agent-job logs written event by event through the store API, in the format of an agent job
(docs/formats.md, "Agent jobs"): what the agent runner records, built here without it, so that
verification, packs and the trace are tested on logs whose every event a test controls."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from affidavit.core.agent_steps import agent_hash, agent_node_id, agent_step_id
from affidavit.core.canonical import canonical, canonical_sha256
from affidavit.core.ids import new_job_id
from affidavit.core.plan import args_hash, idempotency_key
from affidavit.record._sealing import Sealer
from affidavit.store import NewEvent, Store

AGENT, VERSION = "refund_agent", "1"
POLICY = {
    "in_flight": "park",
    "replay_verification": "strict",
    "retry": {"max_attempts": 3, "backoff_seconds": 1.0},
    "max_concurrency": 8,
}
_T0 = dt.datetime(2026, 11, 28, 5, 0, 0, tzinfo=dt.UTC)

Event = tuple[str, dict[str, Any]]  # (type, payload)


@dataclass
class Ledger:
    """A ledger row as the runtime leaves it (committed, or started when left in flight)."""

    key: str
    node_id: str
    step_id: str
    tool_name: str
    args_hash: str
    invocation_id: str
    result: Any
    status: str = "committed"


@dataclass
class AgentLog:
    """An agent job's log, built call by call in program order (each call takes the next seq)."""

    job_id: str = field(default_factory=new_job_id)
    agent: str = AGENT
    version: str | None = VERSION  # None: an agent not pinned
    events: list[Event] = field(default_factory=list)
    ledger: list[Ledger] = field(default_factory=list)
    seq: int = 0
    _clock: itertools.count[int] = field(default_factory=itertools.count)
    _invocations: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def at(self, seconds: float | None = None) -> str:
        """The next event's time: one millisecond after the last (or ``seconds`` after T0)."""
        tick = next(self._clock) if seconds is None else int(seconds * 1000)
        moment = _T0 + dt.timedelta(milliseconds=tick)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def add(self, event_type: str, **payload: Any) -> dict[str, Any]:
        body = {"at": self.at(), **payload}
        self.events.append((event_type, body))
        return body

    # --- the job --------------------------------------------------------------------------------

    def start(self, job_input: Any = None, *, namespace: str = "default") -> AgentLog:
        self.add(
            "job_created",
            input={"order_id": "A-1"} if job_input is None else job_input,
            plan_name=self.agent,
            namespace=namespace,
            submitted_by=None,
            idempotency_key=None,
            kind="agent",
        )
        self.add(
            "agent_started",
            agent=self.agent,
            agent_version=self.version,
            agent_hash=agent_hash(self.agent, self.version),
            policy=POLICY,
        )
        return self

    def complete(self, output: Any) -> AgentLog:
        self.add("job_completed", output=output)
        return self

    # --- steps ----------------------------------------------------------------------------------

    def called(self, kind: str, tool_name: str | None, args: dict[str, Any]) -> tuple[str, str]:
        """``step_called`` of the next step; its (node id, step id)."""
        seq = self.seq
        self.seq += 1
        node_id, step_id = agent_node_id(seq), agent_step_id(self.job_id, seq, kind)
        self.add(
            "step_called",
            seq=seq,
            node_id=node_id,
            step_id=step_id,
            kind=kind,
            tool_name=tool_name,
            args=args,
            args_hash=args_hash(args),
        )
        return node_id, step_id

    def tool(
        self,
        tool_name: str,
        args: dict[str, Any],
        result: Any,
        *,
        fail_first: bool = False,
        in_flight: bool = False,
    ) -> str:
        """A tool call: T1 and T2 (with one failed try first, or left in flight after T1)."""
        node_id, step_id = self.called("tool", tool_name, args)
        self.add("node_started", node_id=node_id, step_id=step_id, attempt=1, worker_id="w1")
        key = idempotency_key(self.job_id, step_id, tool_name, args)
        hashed = args_hash(args)
        common = {"node_id": node_id, "step_id": step_id, "idempotency_key": key}
        tries = 2 if fail_first else 1
        for attempt in range(1, tries + 1):
            invocation = f"inv-{next(self._invocations)}"
            self.add(
                "tool_invocation_started",
                **common,
                invocation_id=invocation,
                tool_name=tool_name,
                args_hash=hashed,
                attempt=attempt,
            )
            if in_flight:
                self.ledger.append(
                    Ledger(key, node_id, step_id, tool_name, hashed, invocation, None, "started")
                )
                return node_id
            if attempt < tries:
                self.add(
                    "tool_invocation_finished",
                    **common,
                    invocation_id=invocation,
                    outcome="failure",
                    error={"type": "RetryableError", "message": "try again"},
                    catch_up=False,
                )
                self.add(
                    "node_finished",
                    node_id=node_id,
                    step_id=step_id,
                    result_type="retryable_failure",
                    error={"type": "RetryableError", "message": "try again"},
                    attempt=attempt,
                    duration_ms=1,
                )
                continue
            self.add(
                "tool_invocation_finished",
                **common,
                invocation_id=invocation,
                outcome="success",
                result=result,
                catch_up=False,
            )
            self.add(
                "command_committed",
                **common,
                command_id=invocation,
                result_hash=canonical_sha256(result),
            )
            self.add(
                "node_finished",
                node_id=node_id,
                step_id=step_id,
                result_type="side_effect_committed",
                attempt=attempt,
                duration_ms=3,
            )
            self.ledger.append(Ledger(key, node_id, step_id, tool_name, hashed, invocation, result))
        return node_id

    def pure(self, tool_name: str, args: dict[str, Any], output: Any) -> str:
        node_id, step_id = self.called("pure", tool_name, args)
        self.add("node_started", node_id=node_id, step_id=step_id, attempt=1, worker_id="w1")
        self.add(
            "node_finished",
            node_id=node_id,
            step_id=step_id,
            result_type="pure",
            output=output,
            attempt=1,
            duration_ms=2,
        )
        return node_id

    def recorded(self, kind: str, value: Any) -> str:
        """``ctx.now()`` / ``uuid()`` / ``random()`` / ``patched()``: the value, recorded."""
        node_id, step_id = self.called(kind, None, {})
        self.add(
            "node_finished",
            node_id=node_id,
            step_id=step_id,
            result_type="pure",
            output=value,
            attempt=1,
            duration_ms=0,
        )
        return node_id

    def wait(
        self, kind: str, key: str, payload: Any, *, answered: bool = True, by: str = "operator"
    ) -> str:
        """``ctx.wait`` / ``ctx.approval``: waiting, then (``answered``) the signal and the
        step's end."""
        args = {"key": key} if kind == "wait" else {"key": key, "payload": {"amount": 150}}
        node_id, step_id = self.called(kind, None, args)
        self.add("node_started", node_id=node_id, step_id=step_id, attempt=1, worker_id="w1")
        self.add(
            "job_waiting",
            node_id=node_id,
            wait_type="approval" if kind == "approval" else "signal",
            correlation_key=key,
            reason=f"{kind} {key!r}",
        )
        if answered:
            self.add(
                "wait_completed",
                node_id=node_id,
                correlation_key=key,
                payload=payload,
                signalled_by=by,
            )
            self.add(
                "node_finished",
                node_id=node_id,
                step_id=step_id,
                result_type="pure",
                output=payload,
                attempt=1,
                duration_ms=0,
            )
        return node_id

    def sleep(self, seconds: float, *, fired_early: bool = False) -> str:
        """``ctx.sleep``: a timer wait, fired by the worker that claims the job after wake_at."""
        node_id, step_id = self.called("sleep", None, {"seconds": seconds})
        started = self.add(
            "node_started", node_id=node_id, step_id=step_id, attempt=1, worker_id="w1"
        )
        wake = dt.datetime.fromisoformat(started["at"]) + dt.timedelta(seconds=seconds)
        key = f"{self.job_id}:{node_id}"
        self.add(
            "job_waiting",
            node_id=node_id,
            wait_type="timer",
            correlation_key=key,
            reason=f"sleep {seconds}s",
            wake_at=wake.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )
        fired = wake - dt.timedelta(seconds=1) if fired_early else wake
        self.events.append(
            (
                "wait_completed",
                {
                    "at": fired.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                    "node_id": node_id,
                    "correlation_key": key,
                    "payload": None,
                    "signalled_by": "timer",
                },
            )
        )
        self.add(
            "node_finished",
            node_id=node_id,
            step_id=step_id,
            result_type="pure",
            attempt=1,
            duration_ms=0,
        )
        return node_id

    # --- queries --------------------------------------------------------------------------------

    def index(self, event_type: str, nth: int = 0, node_id: str | None = None) -> int:
        """The 0-based position of the ``nth`` event of ``event_type`` (of ``node_id``)."""
        found = [
            i
            for i, (t, p) in enumerate(self.events)
            if t == event_type and (node_id is None or p.get("node_id") == node_id)
        ]
        return found[nth]


def refund_agent_log(job_id: str | None = None) -> AgentLog:
    """The refund as an agent records it: look up, decide, an approval, a durable sleep, the
    refund (one retry), a recorded time, the e-mail, and the function's return."""
    log = AgentLog(job_id=job_id or new_job_id()).start()
    log.tool("lookup_order", {"order_id": "A-1"}, {"order_id": "A-1", "total": 150})
    log.pure("decide_refund", {"order": {"order_id": "A-1", "total": 150}}, {"amount": 150})
    log.wait("approval", "big_refund", {"approved": True, "by": "ops"})
    log.sleep(2)
    log.tool(
        "issue_refund", {"amount": 150, "order_id": "A-1"}, {"refund_id": "R-1"}, fail_first=True
    )
    log.recorded("now", "2026-11-28T05:00:01.000000Z")
    log.tool("send_email", {"order_id": "A-1", "template": "refunded"}, {"sent": True})
    log.complete({"refunded": 150})
    return log


def terminal_status(events: Sequence[Event]) -> str:
    last = events[-1][0] if events else ""
    return {"job_completed": "completed", "job_failed": "failed"}.get(last, "running")


def store_log(
    store: Store,
    log: AgentLog,
    *,
    events: Sequence[Event] | None = None,
    status: str | None = None,
    seal: bool = True,
) -> str:
    """Write ``log`` (or ``events`` in its place) as a job of ``store``: its job row, its
    events, its ledger rows and — when the job is terminal and ``seal`` — a seal signed with the
    test's key. Returns the job id."""
    chosen = list(log.events if events is None else events)
    status = status or terminal_status(chosen)
    created = chosen[0][1]
    terminal = chosen[-1][1] if status in ("completed", "failed") else {}
    with store.transaction() as tx:
        tx.create_job(
            job_id=log.job_id,
            namespace=created.get("namespace", "default"),
            plan_name=created.get("plan_name"),
            status="pending",
        )
        tx.append(
            log.job_id,
            [NewEvent(t, p) for t, p in chosen],
            expected_version=0,
        )
        for row in log.ledger:
            tx.ledger_insert(
                job_id=log.job_id,
                key=row.key,
                node_id=row.node_id,
                step_id=row.step_id,
                tool_name=row.tool_name,
                args_hash=row.args_hash,
                invocation_id=row.invocation_id,
                attempt_id=None,
            )
            if row.status == "committed":
                tx.ledger_finish(log.job_id, row.key, status="committed", result=row.result)
        tx.update_job(
            log.job_id,
            status=status,
            output=terminal.get("output") if status == "completed" else None,
            error=terminal.get("error") if status == "failed" else None,
        )
        if seal and status in ("completed", "failed", "cancelled"):
            Sealer.for_store(store).seal_txn(tx, log.job_id)
    return log.job_id


def payload_bytes(payload: dict[str, Any]) -> bytes:
    return canonical(payload)
