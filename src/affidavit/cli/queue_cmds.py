"""``affidavit queues set | list | show``: queues with limits, kept in the database where every
worker reads them (see docs/queues.md); and the options ``submit`` and ``worker`` take for
them."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.cli.output import escape
from affidavit.core.errors import ConfigError
from affidavit.store.queues import get_queue, list_queues, queue_config, queue_stats, set_queue

queues_app = typer.Typer(
    help="Queues with limits: concurrency across workers, per worker, rate, priority, partitions.",
    no_args_is_help=True,
)

QueueOption = Annotated[
    str | None,
    typer.Option("--queue", help="The queue the job waits in (default: the default queue)."),
]
PriorityOption = Annotated[
    int | None,
    typer.Option("--priority", help="Lower runs first (a queue set with --priority)."),
]
PartitionKeyOption = Annotated[
    str | None,
    typer.Option(
        "--partition-key", help="One running job per key at a time (a --partitioned queue)."
    ),
]
NotBeforeOption = Annotated[
    str | None,
    typer.Option("--not-before", help="Not claimed before this time (ISO 8601, with a zone)."),
]
WorkerQueuesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--queue",
        help="Claim from this queue only (repeat for more; 'default' is the default queue). "
        "Default: every queue.",
    ),
]


def parse_not_before(text: str | None) -> datetime | None:
    """``--not-before``'s ISO 8601 time (``Z`` or an offset required).

    Raises:
        ConfigError: not such a time.
    """
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text.strip()) if len(text) <= 64 else None
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise ConfigError(
            f"--not-before is not an ISO 8601 time with a zone: {text[:64]!r}",
            hint="Write e.g. 2026-12-24T18:00:00Z.",
        )
    return at


@queues_app.command("set")
def queues_set(
    name: Annotated[str, typer.Argument(help="The queue's name.")],
    concurrency: Annotated[
        int | None, typer.Option(help="At most N of its jobs running at once, across workers.")
    ] = None,
    worker_concurrency: Annotated[
        int | None, typer.Option(help="At most N of its jobs running at once per worker.")
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(help="At most N job starts in any sliding window: N/PERIOD, e.g. 100/60s."),
    ] = None,
    priority: Annotated[
        bool, typer.Option("--priority", help="Claim lowest --priority first.")
    ] = False,
    partitioned: Annotated[
        bool, typer.Option("--partitioned", help="One running job per --partition-key.")
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create or replace a queue's configuration (what is left out is unlimited or off).
    Every worker reads it from the database: the change holds from their next claim.

    Exit codes: 0 set; 3 a bad name or option, or a store error.
    """
    with command(as_json):
        config = queue_config(
            name,
            concurrency=concurrency,
            worker_concurrency=worker_concurrency,
            rate=rate,
            priority=priority,
            partitioned=partitioned,
        )
        with opened(db) as store:
            set_queue(store, config)
    if as_json:
        output.emit_json(config.to_dict())
    else:
        output.out.print(f"queue {escape(name)} set: {_limits(config.to_dict())}")


@queues_app.command("list")
def queues_list(db: DbOption = None, as_json: JsonOption = False) -> None:
    """List the queues: configuration, pending, running and waiting jobs, starts in the last
    period (the rate's, else a minute).

    Exit codes: 0 listed; 3 a store error.
    """
    with command(as_json), opened(db) as store:
        now = time.time()
        docs = [queue_stats(store, c, now) for c in list_queues(store)]
    if as_json:
        output.emit_json({"queues": docs})
        return
    if not docs:
        output.out.print("no queue is set: jobs go to the default queue (unlimited)")
        return
    table = output.table("queue", "limits", "pending", "running", "waiting", "started")
    for doc in docs:
        table.add_row(
            escape(doc["name"]),
            _limits(doc),
            str(doc["pending"]),
            str(doc["running"]),
            str(doc["waiting"]),
            f"{doc['started_in_period']} in {doc['period_seconds']:g}s",
        )
    output.out.print(table)


@queues_app.command("show")
def queues_show(
    name: Annotated[str, typer.Argument(help="The queue's name.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one queue: its configuration, pending, running and waiting jobs, and its starts
    in the last period.

    Exit codes: 0 shown; 3 no such queue, or a store error.
    """
    with command(as_json), opened(db) as store:
        config = get_queue(store, name)
        if config is None:
            raise ConfigError(
                f"no queue {name!r}",
                hint="`affidavit queues list` lists them; `affidavit queues set` makes one.",
            )
        doc = queue_stats(store, config, time.time())
    if as_json:
        output.emit_json(doc)
        return
    for key, value in doc.items():
        output.out.print(f"{key + ':':<20}{escape(str(value))}")


def _limits(doc: dict[str, Any]) -> str:
    parts = [
        f"{key.replace('_', ' ')} {doc[key]}"
        for key in ("concurrency", "worker_concurrency", "rate")
        if doc[key] is not None
    ]
    parts += [key for key in ("priority", "partitioned") if doc[key]]
    return escape(", ".join(parts) or "unlimited")
