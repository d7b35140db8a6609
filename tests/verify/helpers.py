"""Real jobs for the verification tests, and direct database access for tampering with them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from affidavit import Runtime, Tool, ToolContext, ToolRegistry
from affidavit.core import crash as crash_module
from affidavit.core.canonical import canonical_sha256
from affidavit.core.chain import GENESIS, chain_next
from affidavit.core.plan import Plan, args_hash, idempotency_key
from affidavit.examples import refund
from affidavit.store.postgres import split_url
from affidavit.store.sqlite import connect_raw
from tests.runtime.helpers import wait_lease_expired

LEASE = 0.3


# the keys of a verification result, in the order of docs/formats.md §6
SECTION6_KEYS = [
    "job_id",
    "execution_hash",
    "event_chain_root_hash",
    "tool_invocation_ledger_proof",
    "replay_proof_result",
    "stored_chain",
    "seal",
    "ok",
]


class SimulatedCrash(BaseException):
    """Raised at a crash point: the run stops there, as if the process had died (the runner
    catches only ``Exception``, so nothing is cleaned up and the lease is left to expire)."""


def arm_crash(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """The next time a runner reaches ``point`` it "dies" there."""
    armed = [True]

    def crash_point(name: str) -> None:
        if name == point and armed[0]:
            armed[0] = False
            raise SimulatedCrash(name)

    monkeypatch.setattr(crash_module, "crash_point", crash_point)


def refund_job(rt: Runtime, data_dir: Path, order_id: str = "A-1001") -> str:
    """Run the demo's refund agent to completion; return the job id."""
    refund.setup_shop(data_dir)
    job = rt.submit(refund.PLAN, {"order_id": order_id, "data_dir": str(data_dir)})
    rt.run_until_idle()
    assert rt.get_job(job.job_id).status == "completed"
    return job.job_id


def charge_tool(name: str = "charge", *, fail: bool = False) -> Tool:
    def fn(ctx: ToolContext, amount: int = 1) -> dict[str, Any]:
        if fail:
            raise ValueError("card declined")
        return {"charged": amount, "key": ctx.external_key}

    return Tool(name, fn, "tool")


def tools(*extra: Tool) -> ToolRegistry:
    return ToolRegistry([charge_tool(), *extra])


def plan(*nodes: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {
        "name": "verify-test",
        "retry": {"max_attempts": 1, "backoff_seconds": 0},
        **settings,
        "nodes": list(nodes),
    }


TWO_CHARGES = plan(
    {"id": "a", "type": "tool", "tool": "charge", "args": {"amount": "${input.amount}"}},
    {"id": "b", "type": "tool", "tool": "charge", "args": {"amount": 2}, "depends_on": ["a"]},
)


CHARGE_THEN_APPROVAL = plan(
    {"id": "a", "type": "tool", "tool": "charge", "args": {"amount": 1}},
    {"id": "ok", "type": "approval", "depends_on": ["a"]},
)


def waiting_job(rt: Runtime) -> str:
    """A job that charged once and now waits for an approval (not terminal, not sealed)."""
    job_id = rt.submit(CHARGE_THEN_APPROVAL).job_id
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "waiting"
    return job_id


def crash_in_flight(rt: Runtime, monkeypatch: pytest.MonkeyPatch, job_plan: dict[str, Any]) -> str:
    """Submit and run until the first tool step's T1 committed, then "die": the job is left
    running with one invocation in flight."""
    job_id = rt.submit(job_plan, {"amount": 4}).job_id
    arm_crash(monkeypatch, "tool.after_acquire")
    with pytest.raises(SimulatedCrash):
        rt.run_until_idle()
    assert rt.get_job(job_id).status == "running"
    return job_id


def park_in_flight(rt: Runtime, monkeypatch: pytest.MonkeyPatch, job_plan: dict[str, Any]) -> str:
    """As :func:`crash_in_flight`, then recover: no reconcile hook, so the job parks."""
    job_id = crash_in_flight(rt, monkeypatch, job_plan)
    wait_lease_expired(rt.store, job_id)
    rt.run_until_idle()
    assert rt.get_job(job_id).status == "parked"
    return job_id


@dataclass
class RawDb:
    """Direct SQL on the database behind a store URL (``?`` placeholders), bypassing the
    store — the way someone with write access to the database would tamper with it."""

    url: str

    def transaction(self) -> AbstractContextManager[Any]:
        """A cursor in one transaction, committed when the block ends (its locks held till
        then); ``?`` placeholders through :meth:`q`."""
        return self._cursor()

    def q(self, query: str) -> str:
        return self._q(query)

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self.url.startswith("sqlite:///"):
            conn = connect_raw(self.url[len("sqlite:///") :])
            try:
                yield conn.cursor()
                conn.commit()
            finally:
                conn.close()
        else:
            conninfo, schema = split_url(self.url)
            with psycopg.connect(conninfo) as pg:
                if schema:
                    pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                yield pg.cursor()

    def _q(self, query: str) -> str:
        return query if self.url.startswith("sqlite:///") else query.replace("?", "%s")

    def execute(self, query: str, params: Sequence[Any] = ()) -> int:
        with self._cursor() as cur:
            cur.execute(self._q(query), params)
            return int(cur.rowcount)

    def rows(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._cursor() as cur:
            cur.execute(self._q(query), params)
            return [tuple(r) for r in cur.fetchall()]

    def events(self, job_id: str) -> list[tuple[int, str, str, bytes, str]]:
        """(version, event_id, type, payload bytes, chain_hash) in version order."""
        return [
            (int(v), e, t, bytes(p), h)
            for v, e, t, p, h in self.rows(
                "SELECT version, event_id, type, payload, chain_hash FROM events "
                "WHERE job_id = ? ORDER BY version",
                (job_id,),
            )
        ]

    def set_payload(self, job_id: str, version: int, payload: bytes) -> None:
        self.execute(
            "UPDATE events SET payload = ? WHERE job_id = ? AND version = ?",
            (payload, job_id, version),
        )

    def rewrite_log(self, job_id: str, events: Sequence[tuple[str, str, bytes]]) -> None:
        """Replace the job's whole log with ``(event_id, type, payload)``, correctly re-chained
        from scratch (what a forger with database access can always do)."""
        head = GENESIS
        rows = []
        for version, (event_id, event_type, payload) in enumerate(events, start=1):
            head = chain_next(head, event_id, event_type, payload)
            rows.append((job_id, version, event_id, event_type, payload, head.hex()))
        with self._cursor() as cur:
            cur.execute(self._q("DELETE FROM events WHERE job_id = ?"), (job_id,))
            cur.executemany(self._q(self._event_insert()), rows)

    def insert_event(self, row: tuple[str, int, str, str, bytes, str]) -> None:
        """Insert ``(job_id, version, event_id, type, payload, chain_hash)`` where the store
        would put it."""
        self.execute(self._event_insert(), row)

    def _event_insert(self) -> str:
        if self.url.startswith("sqlite:///"):  # a log there is a range of seq (see sqlite.py)
            return (
                "INSERT INTO events (seq, job_id, version, event_id, type, payload, chain_hash) "
                "VALUES ((SELECT number << 32 FROM jobs WHERE job_id = ?1) + ?2, "
                "?1, ?2, ?3, ?4, ?5, ?6)"
            )
        return (
            "INSERT INTO events (job_id, version, event_id, type, payload, chain_hash) "
            "VALUES (?, ?, ?, ?, ?, ?)"
        )


# --- synthetic logs, for the fold's tests (no runtime, no database) ----------------------------

Event = dict[str, Any]  # {"type", "payload": dict, or the raw payload bytes}
Log = tuple[str, list[Event]]  # (job id, events)


def synthetic_log(job_id: str = "job-fast-path") -> Log:
    """A diamond of steps (a -> b, a -> c, b + c -> d), with a failed try and a retry of one
    tool step, a pure step, a float in one result, and the terminal event."""
    nodes = [
        {"id": "a", "type": "tool", "tool": "charge", "args": {"n": 1}},
        {"id": "b", "type": "tool", "tool": "charge", "args": {"n": 2}, "depends_on": ["a"]},
        {"id": "c", "type": "pure", "tool": "sum", "args": {}, "depends_on": ["a"]},
        {"id": "d", "type": "tool", "tool": "charge", "args": {}, "depends_on": ["b", "c"]},
    ]
    plan = Plan.parse({"nodes": nodes})
    steps = plan.step_ids(job_id)
    events: list[Event] = [
        {"type": "job_created", "payload": {"input": {}}},
        {
            "type": "plan_generated",
            "payload": {"task_graph": dict(plan.task_graph), "plan_hash": plan.plan_hash},
        },
    ]

    def add(event_type: str, node_id: str, **fields: Any) -> None:
        payload = {"node_id": node_id, "step_id": steps[node_id], **fields}
        events.append({"type": event_type, "payload": payload})

    for node_id in plan.order:
        node = plan.node(node_id)
        add("node_started", node_id, attempt=1)
        if node.type == "pure":
            add("node_finished", node_id, result_type="pure", output={"ok": True})
            continue
        key = idempotency_key(job_id, steps[node_id], "charge", dict(node.args))
        hashed = args_hash(dict(node.args))
        if node_id == "b":  # one failed try first
            add(
                "tool_invocation_started",
                node_id,
                invocation_id="b-1",
                idempotency_key=key,
                tool_name="charge",
                args_hash=hashed,
            )
            add(
                "tool_invocation_finished",
                node_id,
                invocation_id="b-1",
                idempotency_key=key,
                outcome="failure",
            )
        invocation = f"{node_id}-ok"
        result: dict[str, Any] = {"charged": node_id, "args": hashed}
        if node_id == "d":
            result["fee"] = 2.5
            output = {"d": result}  # the job's output: its sink's committed result
        add(
            "tool_invocation_started",
            node_id,
            invocation_id=invocation,
            idempotency_key=key,
            tool_name="charge",
            args_hash=hashed,
        )
        add(
            "tool_invocation_finished",
            node_id,
            invocation_id=invocation,
            idempotency_key=key,
            outcome="success",
            result=result,
        )
        add(
            "command_committed",
            node_id,
            command_id=invocation,
            idempotency_key=key,
            result_hash=canonical_sha256(result),
        )
        add("node_finished", node_id, result_type="side_effect_committed")
    events.append({"type": "job_completed", "payload": {"output": output}})
    return job_id, events


def rows(events: list[Event]) -> list[tuple[int, str, str, bytes, str]]:
    head, out = GENESIS, []
    for version, e in enumerate(events, start=1):
        payload = e["payload"]
        data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        event_id = f"e{version}"
        head = chain_next(head, event_id, e["type"], data)
        out.append((version, event_id, e["type"], data, head.hex()))
    return out


def reseal_v1(url: str, job_id: str) -> None:
    """Turn the job's seal into the v1 seal a release before seal v2 would have written (the
    same head and length, signed with the store's own key, no events root), and its queued
    transparency-log leaf with it when it is not integrated yet."""
    from affidavit.core.seal import log_leaf, sign_seal
    from affidavit.core.signing import SigningKey, default_key_path

    raw = RawDb(url)
    [(count, root, sealed_at)] = raw.rows(
        "SELECT event_count, event_chain_root_hash, sealed_at FROM seals WHERE job_id = ?",
        (job_id,),
    )
    key = SigningKey.load(default_key_path(url))
    seal = sign_seal(
        key.private, job_id=job_id, event_count=count, event_chain_root_hash=root,
        sealed_at=sealed_at,
    )  # fmt: skip
    raw.execute(
        "UPDATE seals SET version = 1, events_root = NULL, signature = ? WHERE job_id = ?",
        (seal.signature, job_id),
    )
    raw.execute("UPDATE tlog_queue SET leaf = ? WHERE job_id = ?", (log_leaf(seal), job_id))
