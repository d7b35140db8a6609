"""``affidavit limits``: the tool and model limits across workers, and their use now (see
:mod:`affidavit.runtime._limits`)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import typer
from pydantic import BaseModel
from rich.table import Table

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened

limits_app = typer.Typer(help="Tool and model limits across workers.", no_args_is_help=True)


class LimitDoc(BaseModel):
    """One limit in ``affidavit limits list --json``: its configuration as its last grant was
    taken with, and its use now."""

    name: str
    rate: str | None  # "N/PERIODs"
    concurrency: int | None
    in_flight: int  # grants held by calls whose claim still holds its job
    started_in_window: int  # grants in the last period of the rate
    last_grant_at: str | None


def _iso(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1e6, UTC).isoformat(timespec="microseconds")


@limits_app.command("list")
def list_limits(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Every limit a call has taken a grant of: its rate and concurrency, the calls in flight
    now and those started in the rate's last period.

    Exit codes: 0 listed; 3 store error.
    """
    with command(as_json), opened(db) as store, store.transaction(durable=False) as tx:
        usage = tx.limit_usage(now_us=time.time_ns() // 1000)
    docs = [
        LimitDoc(
            name=u.name,
            rate=None if u.rate_count is None else f"{u.rate_count}/{u.period_seconds:g}s",
            concurrency=u.concurrency,
            in_flight=u.in_flight,
            started_in_window=u.in_window,
            last_grant_at=_iso(u.last_grant_us) if u.last_grant_us else None,
        )
        for u in usage
    ]
    if as_json:
        output.emit_json([d.model_dump() for d in docs])
        return
    if not docs:
        output.out.print("No limit has been used yet.")
        return
    table = Table("limit", "rate", "concurrency", "in flight", "started in window", "last grant")
    for d in docs:
        table.add_row(
            d.name,
            d.rate or "-",
            "-" if d.concurrency is None else str(d.concurrency),
            str(d.in_flight) if d.concurrency is None else f"{d.in_flight}/{d.concurrency}",
            "-" if d.rate is None else str(d.started_in_window),
            d.last_grant_at or "-",
        )
    output.out.print(table)
