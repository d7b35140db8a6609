"""Schedules (tables ``schedules`` and ``scheduler_state``, migration 20): every statement the
scheduler and the ``schedules`` commands run, as functions of an open transaction. SQL uses
``?`` placeholders and runs on both backends.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from affidavit.store.base import Store, Transaction


class _Rows(Protocol):
    """What reads need: a transaction, or a snapshot of either backend."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]: ...


_COLUMNS = (
    "name, cron, every_seconds, timezone, target_kind, target, plan_text, tools, input, queue, "
    "catch_up, namespace, paused, created_at, anchor, last_slot, skipped, last_error"
)
#: The prefix of the idempotency key of a schedule's jobs (``schedule:NAME:SLOT``).
KEY_PREFIX = "schedule:"


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One schedule as stored. Slot times are Unix seconds (whole)."""

    name: str
    cron: str | None
    every_seconds: int | None
    timezone: str
    target_kind: str  # "agent" | "plan"
    target: str  # the agent's name, or the plan file's name as given at `add`
    plan_text: str | None  # the plan document (JSON), for a plan target
    tools: tuple[str, ...]  # the --tools given at `add` (shown; workers load their own)
    input: Any
    queue: str | None
    catch_up: str
    namespace: str
    paused: bool
    created_at: str
    anchor: int  # slots at or before it are never due (creation, or the last resume)
    last_slot: int | None  # the latest slot decided (fired, or skipped by catch-up)
    skipped: int  # slots catch-up decided not to fire, in all
    last_error: str | None  # why the scheduler could not fire the last slot it tried

    @classmethod
    def of(cls, row: Sequence[Any]) -> ScheduleRow:
        (name, cron, every, tz, kind, target, plan_text, tools, inp, queue, catch_up, ns) = row[:12]
        paused, created_at, anchor, last_slot, skipped, last_error = row[12:]
        return cls(
            name,
            cron,
            None if every is None else int(every),
            tz,
            kind,
            target,
            plan_text,
            tuple(json.loads(tools)),
            json.loads(inp),
            queue,
            catch_up,
            ns,
            bool(paused),
            created_at,
            int(anchor),
            None if last_slot is None else int(last_slot),
            int(skipped),
            last_error,
        )


def schedule_get(tx: _Rows, name: str) -> ScheduleRow | None:
    rows = tx.query(f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (name,))
    return ScheduleRow.of(rows[0]) if rows else None


def schedule_list(tx: _Rows) -> list[ScheduleRow]:
    return [ScheduleRow.of(r) for r in tx.query(f"SELECT {_COLUMNS} FROM schedules ORDER BY name")]


def schedules_read(store: Store) -> list[ScheduleRow]:
    """Every schedule, read in a snapshot (no write lock: what a scheduler reads each tick to
    learn whether a slot is due)."""
    with store.snapshot() as snap:
        return schedule_list(cast(_Rows, snap))


def schedule_insert(tx: Transaction, row: ScheduleRow) -> None:
    """Insert ``row`` (the caller checked that no schedule has its name)."""
    tx.execute(
        f"INSERT INTO schedules ({_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            row.name,
            row.cron,
            row.every_seconds,
            row.timezone,
            row.target_kind,
            row.target,
            row.plan_text,
            json.dumps(list(row.tools)),
            json.dumps(row.input, sort_keys=True, separators=(",", ":")),
            row.queue,
            row.catch_up,
            row.namespace,
            int(row.paused),
            row.created_at,
            row.anchor,
            row.last_slot,
            row.skipped,
            row.last_error,
        ),
    )


def schedule_delete(tx: Transaction, name: str) -> None:
    tx.execute("DELETE FROM schedules WHERE name = ?", (name,))


def schedule_set_paused(tx: Transaction, name: str, paused: bool, anchor: int | None) -> None:
    """Pause or resume ``name``; a resume moves the anchor to ``anchor`` (slots missed while
    paused are never due)."""
    if anchor is None:
        tx.execute("UPDATE schedules SET paused = ? WHERE name = ?", (int(paused), name))
    else:
        tx.execute(
            "UPDATE schedules SET paused = ?, anchor = ? WHERE name = ?",
            (int(paused), anchor, name),
        )


def schedule_advance(
    tx: Transaction, name: str, slot: int, *, skipped: int, error: str | None
) -> None:
    """Record ``slot`` as decided (never moving ``last_slot`` back), ``skipped`` more slots left
    out by catch-up, and the last error (``None``: none)."""
    tx.execute(
        "UPDATE schedules SET last_slot = ?, skipped = skipped + ?, last_error = ? "
        "WHERE name = ? AND (last_slot IS NULL OR last_slot < ?)",
        (slot, skipped, error, name, slot),
    )


def schedule_set_error(tx: Transaction, name: str, error: str | None) -> None:
    tx.execute("UPDATE schedules SET last_error = ? WHERE name = ?", (error, name))


def schedule_runs(
    tx: _Rows, namespace: str, name: str, limit: int
) -> list[tuple[str, str, str, str]]:
    """The jobs of schedule ``name`` (idempotency key, job id, status, created at), newest slot
    first, at most ``limit``. The keys of one schedule are the range ``schedule:NAME:`` to
    ``schedule:NAME;`` (``;`` follows ``:``), which the jobs index reads in order."""
    low = f"{KEY_PREFIX}{name}:"
    high = f"{KEY_PREFIX}{name};"
    rows = tx.query(
        "SELECT idempotency_key, job_id, status, created_at FROM jobs "
        "WHERE namespace = ? AND idempotency_key >= ? AND idempotency_key < ? "
        "ORDER BY idempotency_key DESC LIMIT ?",
        (namespace, low, high, limit),
    )
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def scheduler_take_lease(tx: Transaction, owner: str, now: float, until: float) -> bool:
    """Take or renew the scheduler's lease for ``owner`` until ``until``, unless another owner
    holds a live one; whether ``owner`` holds it now."""
    tx.execute(
        "UPDATE scheduler_state SET lease_owner = ?, lease_until = ? WHERE id = 1 AND "
        "(lease_owner IS NULL OR lease_owner = ? OR lease_until IS NULL OR lease_until < ?)",
        (owner, until, owner, now),
    )
    rows = tx.query("SELECT lease_owner FROM scheduler_state WHERE id = 1")
    return bool(rows) and rows[0][0] == owner


def scheduler_release_lease(tx: Transaction, owner: str) -> None:
    tx.execute(
        "UPDATE scheduler_state SET lease_owner = NULL, lease_until = NULL "
        "WHERE id = 1 AND lease_owner = ?",
        (owner,),
    )


def scheduler_lease(tx: _Rows) -> tuple[str | None, float | None]:
    """Who holds the scheduler's lease, and until when (``None``: nobody)."""
    rows = tx.query("SELECT lease_owner, lease_until FROM scheduler_state WHERE id = 1")
    if not rows:
        return None, None
    return rows[0][0], None if rows[0][1] is None else float(rows[0][1])
