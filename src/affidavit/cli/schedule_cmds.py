"""``affidavit schedules``: jobs submitted at the slots of a cron expression or a period, by the
scheduler every worker runs (see docs/schedules.md)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.cli.run_options import AgentOption, InputOption, ToolsOption, parse_json_arg
from affidavit.runtime import (
    check_timing,
    delete_schedule,
    list_runs,
    list_schedules,
    load_tools,
    prepare_schedule,
    registry,
    schedule_doc,
    set_paused,
    store_schedule,
)
from affidavit.runtime import get_schedule as _get_schedule

schedules_app = typer.Typer(
    help="Run jobs on a schedule (cron or a fixed period); workers fire them.",
    no_args_is_help=True,
)


class CatchUp(StrEnum):
    none = "none"
    latest = "latest"
    all = "all"


NameArg = Annotated[str, typer.Argument(help="The schedule's name.")]


@schedules_app.command("add")
def add(
    name: NameArg,
    plan: Annotated[
        Path | None, typer.Argument(help="Plan file (.yaml, .yml or .json); or use --agent.")
    ] = None,
    cron: Annotated[
        str | None,
        typer.Option(help='A cron expression, e.g. "0 2 * * *" (02:00 daily).', show_default=False),
    ] = None,
    timezone: Annotated[
        str | None,
        typer.Option(help="With --cron: the IANA time zone it is read in (default UTC)."),
    ] = None,
    every: Annotated[
        str | None,
        typer.Option(
            help="A period: 30s, 5m, 2h, 1d (slots aligned to the Unix epoch).",
            show_default=False,
        ),
    ] = None,
    agent: AgentOption = None,
    tools: ToolsOption = None,
    input: InputOption = None,
    queue: Annotated[
        str | None, typer.Option(help="The queue its jobs go to.", show_default=False)
    ] = None,
    catch_up: Annotated[
        CatchUp,
        typer.Option(
            "--catch-up",
            help="After downtime: fire none of the missed slots, the latest, or all (at most "
            "100, the latest).",
        ),
    ] = CatchUp.latest,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add a schedule. Everything is checked first (a bad cron expression, period, time zone,
    agent, plan or input writes nothing). Its first slot is the first after now.

    Exit codes: 0 added; 3 invalid, a name in use, or store error.
    """
    with command(as_json):
        timing = check_timing(cron, every, timezone)
        for spec in tools or []:
            load_tools(spec)
        job_input = parse_json_arg(input, "--input")
        row = prepare_schedule(
            name,
            timing,
            agent=agent,
            plan=plan,
            tools=registry,
            tool_specs=tuple(tools or ()),
            input=job_input,
            queue=queue,
            catch_up=catch_up.value,
        )
        with opened(db) as store:  # (opened once everything is checked: nothing is written)
            row = store_schedule(store, row)
    doc = schedule_doc(row)
    if as_json:
        output.emit_json(doc)
    else:
        output.out.print(f"schedule {row.name} added; next slot {doc['next_slot']}", markup=False)


def _when(doc: dict[str, Any]) -> str:
    if doc["cron"] is not None:
        return f"cron {doc['cron']} ({doc['timezone']})"
    return f"every {doc['every_seconds']}s"


@schedules_app.command("list")
def list_(db: DbOption = None, as_json: JsonOption = False) -> None:
    """List the schedules: when they fire, their target, queue, catch-up, last and next slot.

    Exit codes: 0 listed; 3 store error.
    """
    with command(as_json), opened(db) as store:
        docs = [schedule_doc(row) for row in list_schedules(store)]
    if as_json:
        output.emit_json({"schedules": docs})
        return
    if not docs:
        output.out.print("no schedules")
        return
    output.plain_table(
        ["NAME", "WHEN", "TARGET", "QUEUE", "CATCH-UP", "STATE", "LAST SLOT", "NEXT SLOT"],
        [
            [
                d["name"],
                _when(d),
                f"{d['target']['kind']} {d['target']['name']}",
                d["queue"] or "-",
                d["catch_up"],
                "paused" if d["paused"] else ("error" if d["last_error"] else "active"),
                d["last_slot"] or "-",
                d["next_slot"] or "-",
            ]
            for d in docs
        ],
    )
    for d in docs:
        if d["last_error"]:
            output.err.print(f"{d['name']}: {d['last_error']}", markup=False, highlight=False)


def _set_paused(name: str, paused: bool, db: str | None, as_json: bool) -> None:
    with command(as_json), opened(db) as store:
        row = set_paused(store, name, paused)
    doc = schedule_doc(row)
    if as_json:
        output.emit_json(doc)
    else:
        state = "paused" if paused else f"resumed; next slot {doc['next_slot']}"
        output.out.print(f"schedule {name} {state}", markup=False)


@schedules_app.command("pause")
def pause(name: NameArg, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Pause a schedule: no slot fires until it is resumed.

    Exit codes: 0 paused; 2 no such schedule; 3 store error.
    """
    _set_paused(name, True, db, as_json)


@schedules_app.command("resume")
def resume(name: NameArg, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Resume a paused schedule; slots missed while it was paused do not fire.

    Exit codes: 0 resumed; 2 no such schedule; 3 store error.
    """
    _set_paused(name, False, db, as_json)


@schedules_app.command("delete")
def delete(name: NameArg, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Delete a schedule (the jobs it submitted stay).

    Exit codes: 0 deleted; 2 no such schedule; 3 store error.
    """
    with command(as_json), opened(db) as store:
        row = delete_schedule(store, name)
    if as_json:
        output.emit_json({"deleted": row.name})
    else:
        output.out.print(f"schedule {name} deleted", markup=False)


@schedules_app.command("runs")
def runs(
    name: NameArg,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 100,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List a schedule's slots that fired and their jobs, newest first.

    Exit codes: 0 listed; 2 no such schedule; 3 store error.
    """
    with command(as_json), opened(db) as store:
        found = list_runs(store, name, limit=limit)
        row = _get_schedule(store, name)
    if as_json:
        output.emit_json({"schedule": schedule_doc(row), "runs": found})
        return
    if not found:
        output.out.print(f"schedule {name} has fired no slot yet")
        return
    output.plain_table(
        ["SLOT", "JOB", "STATUS"], [[r["slot"], r["job_id"], r["status"]] for r in found]
    )
