"""``affidavit retention``: how long finished jobs stay in the live store, and where their
packs go when they leave it (docs/storage.md, Retention)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer
from rich.markup import escape
from rich.table import Table

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.core.errors import ConfigError

retention_app = typer.Typer(
    help="Remove old finished jobs from the live store, each once its verified pack is archived.",
    no_args_is_help=True,
)

JobArg = Annotated[str, typer.Argument(help="The job id.")]


@retention_app.command("set")
def set_cmd(
    finished_older_than: Annotated[
        str,
        typer.Option(
            "--finished-older-than",
            metavar="AGE",
            help="Remove jobs finished longer ago than AGE: 90d, 12h, 30m, 45s or 2w.",
        ),
    ],
    archive: Annotated[
        Path | None,
        typer.Option(
            "--archive",
            metavar="DIR",
            help="Write each job's pack into DIR (created if missing) and verify it before the "
            "job is removed.",
            show_default=False,
        ),
    ] = None,
    no_archive: Annotated[
        bool,
        typer.Option(
            "--no-archive",
            help="Keep no pack: only the job's seal (in the transparency log) and a tombstone "
            "remain.",
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Set the retention policy; workers apply it (every minute, one at a time), or run
    `affidavit retention run`.

    Exit codes: 0 set; 3 bad age, archive directory or store error.
    """
    from affidavit.retention import parse_age, set_policy

    with command(as_json):
        if (archive is None) == (not no_archive):
            raise ConfigError(
                "give exactly one of --archive DIR and --no-archive",
                hint="An archive keeps every removed job's proof pack; --no-archive keeps none.",
            )
        age = parse_age(finished_older_than)
        with opened(db) as store:
            policy = set_policy(store, age, archive)
    if as_json:
        output.emit_json(policy.to_dict())
        return
    where = "no archive" if policy.archive_dir is None else f"archive {policy.archive_dir}"
    output.out.print(
        escape(f"jobs finished more than {finished_older_than} ago leave the live store; {where}")
    )


@retention_app.command("clear")
def clear_cmd(db: DbOption = None) -> None:
    """Remove the retention policy: no job is removed until one is set again.

    Exit codes: 0 cleared; 3 store error.
    """
    from affidavit.retention import clear_policy

    with command(False), opened(db) as store:
        clear_policy(store)
    output.out.print("no retention policy")


@retention_app.command("show")
def show_cmd(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Show the policy, the last run, how many jobs were removed, are due now, or are kept
    (and why), and the holds.

    Exit codes: 0 shown; 3 store error.
    """
    with command(as_json), opened(db, read_only=True) as store:
        doc = _show_doc(store)
    if as_json:
        output.emit_json(doc)
        return
    table = Table(show_header=False, box=None)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    policy = doc["policy"]
    table.add_row(
        "policy",
        "none"
        if policy is None
        else escape(
            f"finished older than {policy['finished_older_than']}, "
            + ("no archive" if policy["archive"] is None else f"archive {policy['archive']}")
        ),
    )
    for key in ("archived", "due_now", "last_run_at", "last_archived", "lease_owner"):
        if doc.get(key) is not None:
            table.add_row(key, escape(str(doc[key])))
    for reason, count in (doc.get("kept") or {}).items():
        if count:
            table.add_row(f"kept: {reason}", str(count))
    for hold in doc["holds"]:
        table.add_row("held", escape(f"{hold['job_id']} since {hold['held_at']}: {hold['reason']}"))
    output.out.print(table)


def _show_doc(store: Any) -> dict[str, Any]:
    import time

    from affidavit.retention import read_policy
    from affidavit.store.retention import (
        Rows,
        archived_count,
        due_job_ids,
        holds,
        kept_counts,
        policy_read,
    )

    policy = read_policy(store)
    doc: dict[str, Any] = {"policy": None if policy is None else policy.to_dict()}
    if not getattr(store, "retention_tables", True):
        return doc | {"archived": 0, "holds": []}
    with store.snapshot() as snap:
        rows = cast(Rows, snap)
        row = policy_read(rows)
        doc["archived"] = archived_count(rows)
        if policy is not None:
            cutoff = policy.finished_before(time.time())
            doc["due_now"] = len(due_job_ids(rows, cutoff, 100_000))
            doc["kept"] = kept_counts(rows, cutoff)
        doc["last_run_at"], doc["last_archived"] = row.last_run_at, row.last_archived
        doc["lease_owner"] = row.lease_owner if (row.lease_until or 0) > time.time() else None
        doc["holds"] = [{"job_id": j, "reason": r, "held_at": at} for j, r, at in holds(rows)]
    return doc


@retention_app.command("run")
def run_cmd(
    limit: Annotated[
        int | None,
        typer.Option(min=1, help="Remove at most this many jobs.", show_default=False),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Apply the policy now: each due job's pack is written into the archive and verified,
    then the job is removed from the live store with its events and ledger (its seal stays,
    with its leaf in the transparency log). A job whose pack cannot be written or verified is
    kept, and named.

    Exit codes: 0 done (or another worker is running retention: "busy"); 1 some job was kept
    because its pack failed; 3 no policy, archive or store error.
    """
    from affidavit.retention import Retention

    with command(as_json), opened(db) as store:
        report = Retention(store).run(limit=limit)
    if as_json:
        output.emit_json(report.to_dict())
    elif report.busy:
        output.out.print("another worker is running retention; nothing done")
    else:
        output.out.print(f"{len(report.archived)} job(s) archived in {report.seconds:.1f} s")
        for job_id, why in report.failed.items():
            output.err.print(escape(f"kept {job_id}: {why}"), highlight=False)
    if report.failed:
        raise typer.Exit(output.EXIT_FAILED)


@retention_app.command("hold")
def hold_cmd(
    job_id: JobArg,
    reason: Annotated[str, typer.Option(help="Why the job is held (a case, an inquiry).")],
    db: DbOption = None,
) -> None:
    """Hold a job: retention never removes it while held.

    Exit codes: 0 held; 3 no such job in the live store, or store error.
    """
    from affidavit.retention import hold_job

    with command(False), opened(db) as store:
        hold_job(store, job_id, reason)
    output.out.print(escape(f"{job_id} held"))


@retention_app.command("release")
def release_cmd(job_id: JobArg, db: DbOption = None) -> None:
    """Release a job's hold.

    Exit codes: 0 released (or it was not held); 3 store error.
    """
    from affidavit.retention import release_job

    with command(False), opened(db) as store:
        held = release_job(store, job_id)
    output.out.print(escape(f"{job_id} released" if held else f"{job_id} was not held"))


def list_archived(namespace: str | None, limit: int, db: str | None, as_json: bool) -> None:
    """``jobs list --archived``: the tombstones, the latest removed first."""
    from affidavit.store.retention import Rows, tombstones

    with command(as_json), opened(db, read_only=True) as store, store.snapshot() as snap:
        found = tombstones(cast(Rows, snap), namespace=namespace, limit=limit)
    if as_json:
        output.emit_json([t.to_dict() for t in found])
        return
    if not found:
        output.err.print("no archived jobs")
        return
    headers = ("job_id", "status", "plan", "namespace", "archived_at", "pack")
    rows = [
        (t.job_id, t.status, t.plan_name or "", t.namespace, t.archived_at, t.pack_path or "-")
        for t in found
    ]
    output.plain_table(headers, rows)
