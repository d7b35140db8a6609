"""Tools for the chaos suite, loaded by real ``affidavit worker`` processes (``--tools``).

Each effectful tool records its effect as one row of ``effects`` in a PostgreSQL database of
the world (``CHAOS_WORLD_URL``: a schema of the test's own on a server the test does not
restart, so that an effect is never held up by the jobs' database being away), keyed by the
external key the runtime gives the call (``affidavit:<job>:<step>:<attempt>``), as a payment
API keyed by an idempotency key would: a call repeated by the same attempt (a retry after a
lost reply) finds its row; a second attempt — a re-execution after a crash, which the runtime
must never make once the effect is recorded — writes a second row for the same step, which
the test counts. ``reconcile`` looks the dead attempt's key up in the same table.

A world database that is unavailable fails the call as retryable.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

from affidavit import RetryableError, ToolContext, pure, tool

SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    ext_key TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    pid INTEGER NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


def world_connect() -> psycopg.Connection[Any]:
    """An autocommit connection to the world (``CHAOS_WORLD_URL``, with ``schema=NAME``)."""
    base, _, schema = os.environ["CHAOS_WORLD_URL"].partition("?schema=")
    conn = psycopg.connect(base, autocommit=True, connect_timeout=5)
    if schema:
        conn.execute(f'SET search_path TO "{schema}"')
    return conn


def _with_world(action: Any) -> Any:
    """Run ``action(conn)`` on a fresh connection to the world."""
    try:
        with world_connect() as conn:
            return action(conn)
    except psycopg.OperationalError as exc:
        raise RetryableError(f"the world database is unavailable: {exc}") from exc


def _effect(ctx: ToolContext, kind: str, delay: float) -> dict[str, Any]:
    def insert(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "INSERT INTO effects (ext_key, job_id, node_id, kind, pid) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (ext_key) DO NOTHING",
            (ctx.external_key, ctx.job_id, ctx.node_id, kind, os.getpid()),
        )

    _with_world(insert)
    time.sleep(delay)  # the reply travels back: a window for a kill after the effect
    return {"ref": ctx.external_key, "kind": kind}


def _lookup(ctx: ToolContext, kind: str) -> dict[str, Any] | None:
    def find(conn: psycopg.Connection[Any]) -> Any:
        return conn.execute(
            "SELECT 1 FROM effects WHERE ext_key = %s", (ctx.external_key,)
        ).fetchone()

    return {"ref": ctx.external_key, "kind": kind} if _with_world(find) else None


@tool("chaos_charge")
def charge(ctx: ToolContext, order: int, delay: float = 0.05) -> dict[str, Any]:
    """Charge a customer: one row in ``world.effects``."""
    return _effect(ctx, "charge", delay)


@charge.reconcile
def _charge_reconcile(ctx: ToolContext, order: int, delay: float = 0.05) -> dict[str, Any] | None:
    return _lookup(ctx, "charge")


@tool("chaos_notify")
def notify(ctx: ToolContext, order: int, charge: dict[str, Any], delay: float = 0.05) -> Any:
    """Send the receipt: one row in ``world.effects``."""
    return _effect(ctx, "notify", delay)


@notify.reconcile
def _notify_reconcile(
    ctx: ToolContext, order: int, charge: dict[str, Any], delay: float = 0.05
) -> dict[str, Any] | None:
    return _lookup(ctx, "notify")


@pure("chaos_price")
def price(ctx: ToolContext, order: int) -> dict[str, Any]:
    return {"order": order, "amount": 100 + order}


@pure("chaos_total")
def total(ctx: ToolContext, order: int, amount: int) -> dict[str, Any]:
    return {"order": order, "total": amount + 1}


@pure("chaos_done")
def done(ctx: ToolContext, order: int, receipt: dict[str, Any]) -> dict[str, Any]:
    return {"order": order, "receipt": receipt["ref"]}


def order_plan(delay: float = 0.05) -> dict[str, Any]:
    """Five steps, two of them effectful: price → charge → total → notify → done."""
    return {
        "name": "chaos-order",
        "retry": {"max_attempts": 3, "backoff_seconds": 0},
        "nodes": [
            {"id": "price", "type": "pure", "tool": "chaos_price", "args": {"order": "${input.n}"}},
            {
                "id": "charge",
                "type": "tool",
                "tool": "chaos_charge",
                "args": {"order": "${input.n}", "delay": delay},
                "depends_on": ["price"],
            },
            {
                "id": "total",
                "type": "pure",
                "tool": "chaos_total",
                "args": {"order": "${input.n}", "amount": "${price.amount}"},
                "depends_on": ["charge"],
            },
            {
                "id": "notify",
                "type": "tool",
                "tool": "chaos_notify",
                "args": {"order": "${input.n}", "charge": "${charge}", "delay": delay},
                "depends_on": ["total"],
            },
            {
                "id": "done",
                "type": "pure",
                "tool": "chaos_done",
                "args": {"order": "${input.n}", "receipt": "${notify}"},
                "depends_on": ["notify"],
            },
        ],
    }
