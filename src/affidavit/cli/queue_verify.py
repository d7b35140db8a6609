"""``affidavit verify --queue Q --since T`` and ``--limit NAME --since T``: whether a queue's
limits held (see :mod:`affidavit.verify.queue_limits`), or a tool or model limit's
(:mod:`affidavit.verify.tool_limits`)."""

from __future__ import annotations

import time

import typer
from rich.markup import escape
from rich.table import Table

from affidavit.cli import output
from affidavit.cli.common import command, opened
from affidavit.core.errors import ConfigError
from affidavit.verify.queue_limits import LimitCheck, QueueProof, parse_since, verify_queue
from affidavit.verify.tool_limits import LimitProof, verify_limit

_HINT = "Run `affidavit verify --queue Q --since 2026-12-01T00:00:00Z`."
_LIMIT_HINT = "Run `affidavit verify --limit NAME --since 2026-12-01T00:00:00Z`."


def verify_queue_cmd(
    queue: str | None, since: str | None, db: str | None, as_json: bool, *, alone: bool
) -> None:
    """Check the queue's limits and print the verdict; exit 1 if one did not hold or cannot
    be proved, 3 for a bad command line or an unknown queue (checked before the database is
    opened where it can be)."""
    with command(as_json):
        if not alone:
            raise ConfigError("--queue checks a queue: no job id, --all or filters", hint=_HINT)
        if queue is None or since is None:
            raise ConfigError("--queue and --since go together", hint=_HINT)
        start = parse_since(since)
        with opened(db, read_only=True) as store:
            proof = verify_queue(store, queue, start, time.time())
    if as_json:
        output.emit_json(proof.to_dict())
    else:
        render(proof)
    if not proof.ok:
        raise typer.Exit(output.EXIT_FAILED)


def _row(table: Table, name: str, check: LimitCheck | None, unit: str) -> None:
    if check is None:
        table.add_row(name, "", "no limit")
        return
    mark = "[green]✓[/]" if check.ok else "[bold red]✗[/]"
    doc = check.to_dict()
    where = f" by worker {check.worker}" if check.worker is not None else ""
    detail = f"worst {check.worst} {unit} (limit {check.limit}){where}"
    if check.at is not None:
        detail += f" at {doc['at']}: {', '.join(doc['job_ids'])}"
    if check.unknown:
        detail += f"; {check.unknown} claims without a recorded end: unprovable"
    table.add_row(name, mark, escape(detail))  # (ids come from the database: never markup)


def _limits_table(title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("limit", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("detail", overflow="fold")
    return table


def render(proof: QueueProof) -> None:
    doc = proof.to_dict()
    title = f"queue {escape(proof.config.name)} from {doc['since']} to {doc['until']}"
    table = _limits_table(title)
    _row(table, "rate", proof.rate, "starts in a window")
    _row(table, "concurrency", proof.concurrency, "running at once")
    _row(table, "worker_concurrency", proof.worker_concurrency, "running at once")
    output.out.print(table)
    output.out.print(f"{proof.grants} claims, {proof.starts} starts")
    if proof.ok:
        output.out.print("[green]verified[/]: every limit of the queue held")
    else:
        output.out.print(
            "[bold red]NOT verified[/]: a limit of the queue did not hold or is unprovable"
        )


def verify_limit_cmd(
    name: str, queue: str | None, since: str | None, db: str | None, as_json: bool, *, alone: bool
) -> None:
    """Check a tool or model limit across jobs and print the verdict; exit 1 if it did not
    hold, 3 for a bad command line or a limit never used."""
    with command(as_json):
        if not alone or queue is not None:
            raise ConfigError(
                "--limit checks a limit: no job id, --all, filters or --queue", hint=_LIMIT_HINT
            )
        if since is None:
            raise ConfigError("--limit and --since go together", hint=_LIMIT_HINT)
        start = parse_since(since)
        with opened(db, read_only=True) as store:
            proof = verify_limit(store, name, int(start * 1e6), time.time_ns() // 1000)
    if as_json:
        output.emit_json(proof.to_dict())
    else:
        render_limit(proof)
    if not proof.ok:
        raise typer.Exit(output.EXIT_FAILED)


def render_limit(proof: LimitProof) -> None:
    doc = proof.to_dict()
    title = f"limit {escape(proof.name)} from {doc['since']} to {doc['until']}"
    table = _limits_table(title)
    _row(table, "rate", proof.rate, "calls started in a window")
    _row(table, "concurrency", proof.concurrency, "calls in flight")
    output.out.print(table)
    output.out.print(
        f"{proof.calls} calls in {proof.jobs} jobs; {proof.bounded_ends} closed by a later "
        f"claim (counted until then), {proof.open_calls} not closed yet (counted until now)"
    )
    for job_id in proof.malformed[:10]:
        output.out.print(f"[bold red]✗[/] job {escape(job_id)}: a malformed grant in its log")
    if proof.ok:
        output.out.print("[green]verified[/]: the limit held in every recorded grant")
    else:
        output.out.print(
            "[bold red]NOT verified[/]: the limit did not hold, or a grant is malformed"
        )
