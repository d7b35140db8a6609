"""Schedules: jobs submitted at the slots of a cron expression or a period (see
:mod:`affidavit.runtime._schedule_slots` for the slots, :mod:`affidavit.runtime._scheduler` for
the scheduler workers run). The service functions behind ``affidavit schedules ...``.

Everything :func:`add_schedule` is given is checked before anything is written: the name, the
cron expression or period, the time zone, the agent (registered, its input fitting its
parameters) or the plan (valid, its tools registered), the input and the catch-up mode.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from affidavit.core.canonical import canonical_nested
from affidavit.core.config import DEFAULT_NAMESPACE
from affidavit.core.errors import ConfigError, NotFound, PlanError
from affidavit.core.events import utc_now
from affidavit.core.inputs import InputTooLarge, read_limited_text
from affidavit.core.plan import Plan
from affidavit.record import check_input_references
from affidavit.runtime._schedule_slots import (
    CATCH_UP_MODES,
    Slots,
    check_cron,
    check_timezone,
    iso_slot,
    parse_every,
)
from affidavit.runtime._sdk import ToolRegistry
from affidavit.runtime._submit import check_agent_input, check_plan, resolve_agent
from affidavit.store import Store
from affidavit.store.schedules import (
    KEY_PREFIX,
    ScheduleRow,
    schedule_delete,
    schedule_get,
    schedule_insert,
    schedule_list,
    schedule_runs,
    schedule_set_paused,
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
#: The largest plan document and job input a schedule keeps (bytes).
MAX_PLAN_BYTES = 1 << 20
MAX_INPUT_BYTES = 256 << 10
#: The most runs ``schedules runs`` lists.
MAX_RUNS = 10_000
DEFAULT_CATCH_UP = "latest"


class ScheduleNotFound(NotFound):
    code = "schedule_not_found"
    default_hint = "List schedules with `affidavit schedules list`."

    def __init__(self, name: str) -> None:
        super().__init__(f"schedule {name!r} not found")
        self.name = name


def check_name(name: object, what: str = "schedule") -> str:
    """A schedule's (or queue's) name: 1 to 64 letters, digits, ``_ . -``, not starting with
    a punctuation mark (it is part of the jobs' idempotency keys).

    Raises:
        ConfigError: anything else.
    """
    if not isinstance(name, str) or _NAME.match(name) is None:
        raise ConfigError(
            f"invalid {what} name {name!r}",
            hint="1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit.",
        )
    return name


def slot_key(name: str, slot: int) -> str:
    """The idempotency key of the job of ``name``'s slot ``slot``: ``schedule:NAME:SLOT``."""
    return f"{KEY_PREFIX}{name}:{iso_slot(slot)}"


def slots_of(row: ScheduleRow) -> Slots:
    return Slots(row.cron, row.every_seconds, row.timezone)


@dataclass(frozen=True, slots=True)
class Timing:
    """How a schedule's slots are given: ``cron`` (in ``timezone``) or ``every`` seconds."""

    cron: str | None
    every: int | None
    timezone: str


def check_timing(cron: str | None, every: str | None, timezone: str | None) -> Timing:
    """The checked ``--cron``/``--every``/``--timezone`` of ``schedules add``.

    Raises:
        ConfigError: neither or both of cron and every, a bad expression, period or time zone,
            or a time zone with ``--every`` (its slots are aligned to the Unix epoch).
    """
    if (cron is None) == (every is None):
        raise ConfigError(
            "give --cron or --every" if cron is None else "give --cron or --every, not both",
            hint='`--cron "0 2 * * *"` (02:00 every day) or `--every 30s`.',
        )
    if every is not None:
        if timezone is not None:
            raise ConfigError(
                "--timezone goes with --cron",
                hint="--every slots are aligned to the Unix epoch, the same in every time zone.",
            )
        return Timing(None, parse_every(every), "UTC")
    assert cron is not None
    tz = timezone if timezone is not None else "UTC"
    check_timezone(tz)
    return Timing(check_cron(cron), None, tz)


def _checked_input(input: Any) -> Any:
    job_input = {} if input is None else input
    size = len(canonical_nested(job_input))
    if size > MAX_INPUT_BYTES:
        raise ConfigError(
            f"the input is {size} bytes as canonical JSON (a schedule keeps at most "
            f"{MAX_INPUT_BYTES})",
            hint="Keep large data elsewhere and pass a reference to it.",
        )
    return job_input


def _plan_text(plan: str | Path, tools: ToolRegistry, job_input: Any) -> tuple[str, Plan]:
    try:
        text = read_limited_text(Path(plan), "plan file", limit=MAX_PLAN_BYTES)
    except InputTooLarge as exc:
        raise PlanError(exc.message, hint=exc.hint) from None
    except OSError as exc:
        raise PlanError(f"cannot read plan file {str(plan)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PlanError(f"plan file {str(plan)!r} is not UTF-8 text") from None
    parsed = parse_plan(text, str(plan))
    check_plan(parsed, tools)
    check_input_references(parsed, job_input)
    return text, parsed


def parse_plan(text: str, source: str) -> Plan:
    """The plan a schedule keeps, read as its file was (JSON for ``.json``, else YAML)."""
    return Plan.from_text(text, "json" if source.endswith(".json") else "yaml", source=source)


def prepare_schedule(
    name: str,
    timing: Timing,
    *,
    agent: str | None = None,
    plan: str | Path | None = None,
    tools: ToolRegistry,
    tool_specs: tuple[str, ...] = (),
    input: Any = None,
    queue: str | None = None,
    catch_up: str = DEFAULT_CATCH_UP,
    now: float | None = None,
) -> ScheduleRow:
    """Check everything a schedule is given, without the database; the row to store. Its
    first slot is the first after ``now``.

    Raises:
        ConfigError: a bad name, queue name, catch-up mode or input.
        PlanError: the agent is not registered or the input does not fit it, or the plan is
            invalid or uses a tool that is not registered.
    """
    check_name(name)
    if queue is not None:
        check_name(queue, "queue")
    if catch_up not in CATCH_UP_MODES:
        raise ConfigError(
            f"unknown --catch-up {catch_up!r}", hint=f"One of: {', '.join(CATCH_UP_MODES)}."
        )
    if (agent is None) == (plan is None):
        raise ConfigError(
            "give a plan file or --agent NAME" if agent is None else "give a plan or --agent",
            hint="`affidavit schedules add NAME --every 1h --agent A --tools mytools`.",
        )
    job_input = _checked_input(input)
    plan_text: str | None = None
    if agent is not None:
        found = resolve_agent(agent, tools)
        check_agent_input(found, job_input)
        kind, target = "agent", found.name
    else:
        assert plan is not None
        plan_text, _ = _plan_text(plan, tools, job_input)
        kind, target = "plan", str(plan)
    at = math.floor(time.time() if now is None else now)
    return ScheduleRow(
        name, timing.cron, timing.every, timing.timezone, kind, target, plan_text,
        tuple(tool_specs), job_input, queue, catch_up, DEFAULT_NAMESPACE, False, utc_now(),
        at, None, 0, None,
    )  # fmt: skip


def store_schedule(store: Store, row: ScheduleRow) -> ScheduleRow:
    """Store a row :func:`prepare_schedule` made.

    Raises:
        ConfigError: a schedule of that name exists.
    """
    with store.transaction() as tx:
        if schedule_get(tx, row.name) is not None:
            raise ConfigError(
                f"a schedule named {row.name!r} exists",
                hint=f"Choose another name, or `affidavit schedules delete {row.name}` first.",
            )
        schedule_insert(tx, row)
    return row


def add_schedule(store: Store, name: str, timing: Timing, **given: Any) -> ScheduleRow:
    """:func:`prepare_schedule` (the same arguments), then :func:`store_schedule`."""
    return store_schedule(store, prepare_schedule(name, timing, **given))


def get_schedule(store: Store, name: str) -> ScheduleRow:
    """Raises :class:`ScheduleNotFound`."""
    with store.transaction(durable=False) as tx:
        found = schedule_get(tx, name)
    if found is None:
        raise ScheduleNotFound(name)
    return found


def list_schedules(store: Store) -> list[ScheduleRow]:
    with store.transaction(durable=False) as tx:
        return schedule_list(tx)


def set_paused(store: Store, name: str, paused: bool, *, now: float | None = None) -> ScheduleRow:
    """Pause or resume ``name``. A resume fires nothing for the slots it missed while paused:
    its next slot is the first after ``now``.

    Raises:
        ScheduleNotFound: no such schedule.
    """
    with store.transaction() as tx:
        found = schedule_get(tx, name)
        if found is None:
            raise ScheduleNotFound(name)
        if found.paused != paused:
            anchor = None if paused else math.floor(time.time() if now is None else now)
            schedule_set_paused(tx, name, paused, anchor)
        result = schedule_get(tx, name)
    assert result is not None
    return result


def delete_schedule(store: Store, name: str) -> ScheduleRow:
    """Delete ``name`` (its jobs stay).

    Raises:
        ScheduleNotFound: no such schedule.
    """
    with store.transaction() as tx:
        found = schedule_get(tx, name)
        if found is None:
            raise ScheduleNotFound(name)
        schedule_delete(tx, name)
    return found


def next_slot(row: ScheduleRow, now: float | None = None) -> int | None:
    """The next slot ``row`` fires at (``None`` while paused)."""
    if row.paused:
        return None
    t = math.floor(time.time() if now is None else now)
    after = max(row.anchor, row.last_slot if row.last_slot is not None else row.anchor)
    return slots_of(row).next_after(max(after, t))


def schedule_doc(row: ScheduleRow, now: float | None = None) -> dict[str, Any]:
    """``row`` as ``schedules list --json`` shows it."""
    upcoming = next_slot(row, now)
    return {
        "name": row.name,
        "cron": row.cron,
        "every_seconds": row.every_seconds,
        "timezone": row.timezone,
        "target": {"kind": row.target_kind, "name": row.target},
        "tools": list(row.tools),
        "input": row.input,
        "queue": row.queue,
        "catch_up": row.catch_up,
        "paused": row.paused,
        "created_at": row.created_at,
        "last_slot": None if row.last_slot is None else iso_slot(row.last_slot),
        "next_slot": None if upcoming is None else iso_slot(upcoming),
        "skipped": row.skipped,
        "last_error": row.last_error,
    }


def list_runs(store: Store, name: str, *, limit: int = 100) -> list[dict[str, Any]]:
    """The slots of ``name`` that have a job, newest first: ``slot`` (ISO 8601 UTC),
    ``idempotency_key``, ``job_id``, ``status``, ``created_at``.

    Raises:
        ScheduleNotFound: no such schedule.
    """
    limit = max(1, min(limit, MAX_RUNS))
    with store.transaction(durable=False) as tx:
        found = schedule_get(tx, name)
        if found is None:
            raise ScheduleNotFound(name)
        rows = schedule_runs(tx, found.namespace, name, limit)
    prefix = f"{KEY_PREFIX}{name}:"
    return [
        {
            "slot": key.removeprefix(prefix),
            "idempotency_key": key,
            "job_id": job_id,
            "status": status,
            "created_at": created_at,
        }
        for key, job_id, status, created_at in rows
    ]
