"""``affidavit subjects list | show S`` and ``affidavit erase --subject S | verify FILE |
receipt``: the data subjects whose jobs' values are sealed, and their erasure (docs/privacy.md).

The subject itself is never stored: ``show`` and ``erase`` find it by its keyed hash, which
needs the master key (``$AFFIDAVIT_MASTER_KEY``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.cli.keys_cmds import KeyFileOption
from affidavit.core.canonical import canonical
from affidavit.core.errors import ConfigError, VerificationError
from affidavit.core.signing import public_key_of
from affidavit.privacy import (
    erase,
    list_subjects,
    show_subject,
    stored_receipt,
    verify_receipt,
)
from affidavit.record import Sealer

subjects_app = typer.Typer(
    help="Data subjects: their jobs, first and last use, erasure (never their data).",
    no_args_is_help=True,
)
erase_app = typer.Typer(
    help="Erase a data subject (admin), or check an erasure receipt.",
    invoke_without_command=True,
)

SubjectOption = Annotated[
    str | None,
    typer.Option(
        "--subject", help="The data subject (as given to submit --subject).", show_default=False
    ),
]
OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out", help="Write the erasure receipt (JSON) to this file.", show_default=False
    ),
]


@subjects_app.command("list")
def list_cmd(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Every subject, oldest first: its id (a keyed hash), jobs, first and last use, erasure.

    Exit codes: 0 listed; 3 store error.
    """
    with command(as_json), opened(db, read_only=True) as store:
        rows = list_subjects(store)
    if as_json:
        output.emit_json({"subjects": rows})
        return
    table = Table("subject id", "jobs", "first used", "last used", "erased")
    for r in rows:
        table.add_row(
            r["subject_id"][:16] + "…",
            str(r["jobs"]),
            str(r["first_used"] or "-"),
            str(r["last_used"] or "-"),
            str(r["erased_at"] or "-"),
        )
    output.out.print(table)


@subjects_app.command("show")
def show_cmd(
    subject: Annotated[str, typer.Argument(help="The data subject.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """One subject's jobs, first and last use, and erasure (needs the master key).

    Exit codes: 0 shown; 2 no such subject; 3 a malformed subject, no master key, or store
    error.
    """
    with command(as_json), opened(db, read_only=True) as store:
        doc = show_subject(store, subject)
    if as_json:
        output.emit_json(doc)
        return
    for name in ("subject_id", "key_id", "created_at", "first_used", "last_used", "erased_at"):
        output.out.print(f"{name}: {escape(str(doc[name] or '-'))}")
    if doc["erase_reason"]:
        output.out.print(f"erase_reason: {escape(doc['erase_reason'])}")
    output.out.print(f"jobs ({doc['jobs']}): " + " ".join(doc["job_ids"]))


@erase_app.callback()
def erase_subject(
    ctx: typer.Context,
    subject: SubjectOption = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (recorded in the receipt).")
    ] = None,
    out: OutOption = None,
    key_file: KeyFileOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Erase a subject: destroy its data key in the store's files, so that the values its
    jobs' records hold sealed can never be read again, while every proof still verifies.
    Prints the signed erasure receipt (also logged in the transparency log). A job of the
    subject that is not finished is cancelled first (a tool call in flight finishes and its
    outcome is recorded: until such a job has ended the erasure is refused, its cancel
    requested; erase again then). Run again after a crash: it finishes the scrub and prints
    the same receipt.

    Exit codes: 0 erased (or erased before); 2 no such subject; 3 a job not ended yet, a
    malformed subject or reason, no master key, or store error.
    """
    if ctx.invoked_subcommand is not None:
        return
    with command(as_json):
        if subject is None:
            raise ConfigError("give --subject S", hint="`affidavit erase --subject customer-7`")
        with opened(db) as store:
            sealer = Sealer(key_file) if key_file is not None else Sealer.for_store(store)
            from affidavit.cli.job_view import state_user
            from affidavit.runtime import erasure_cancel

            cancel = erasure_cancel(store, by=state_user(), sealer=sealer)
            done = erase(store, subject, sealer=sealer, reason=reason, cancel=cancel)
        _write(out, done.receipt)
    if as_json:
        output.emit_json(done.to_dict())
        return
    body = done.receipt["receipt"]
    verb = "erased" if done.erased_now else "was erased"
    output.out.print(
        f"subject {body['subject_id'][:16]}… {verb} at {body['erased_at']}: "
        f"{len(body['job_ids'])} job(s)"
    )
    if done.cancelled:
        output.out.print(f"cancelled first: {escape(', '.join(done.cancelled))}")
    if not done.scrubbed:
        output.out.print(
            "[yellow]the database could not drop every copy of the key yet (a reader held the "
            "SQLite WAL, or this PostgreSQL role may not CHECKPOINT): run erase again[/]"
        )
    if out is None:
        output.out.print(canonical(done.receipt).decode(), markup=False, highlight=False)
    else:
        output.out.print(f"receipt written to {escape(str(out))}")


def _write(out: Path | None, receipt: dict[str, Any]) -> None:
    if out is None:
        return
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(canonical(receipt) + b"\n")
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc}") from None


@erase_app.command("receipt")
def receipt_cmd(
    subject: SubjectOption = None,
    out: OutOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """An erased subject's receipt again, with its transparency-log proof once the log has
    integrated it.

    Exit codes: 0 printed; 3 not erased, no master key, or store error.
    """
    with command(as_json):
        if subject is None:
            raise ConfigError("give --subject S")
        with opened(db, read_only=True) as store:
            receipt = stored_receipt(store, subject)
        _write(out, receipt)
    if as_json or out is None:
        output.emit_json(receipt)
    else:
        output.out.print(f"receipt written to {escape(str(out))}")


@erase_app.command("verify")
def verify_cmd(
    file: Annotated[Path, typer.Argument(help="An erasure receipt (erase --out FILE).")],
    key: Annotated[str, typer.Option("--key", help="The seal public key (a PEM file or base64).")],
    log_key: Annotated[
        str | None,
        typer.Option("--log-key", help="The transparency log's vkey: check the receipt is logged."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Verify an erasure receipt offline: its signature under --key, and with --log-key its
    inclusion in the transparency log.

    Exit codes: 0 it holds; 1 it does not; 3 usage error (unreadable file or key).
    """
    from affidavit.cli.log_cmds import read_vkey
    from affidavit.privacy import MAX_RECEIPT_BYTES

    with command(as_json):
        try:
            if file.stat().st_size > MAX_RECEIPT_BYTES:
                raise VerificationError(f"{file} is over {MAX_RECEIPT_BYTES} bytes")
            data = file.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {file}: {exc}") from None
        check = verify_receipt(data, public_key_of(key), read_vkey(log_key) if log_key else None)
    if as_json:
        output.emit_json(check.to_dict())
    elif check.ok:
        logged = " and logged" if check.logged else ""
        output.out.print(
            f"[green]receipt verified{logged}[/]: subject {check.subject_id}, erased at "
            f"{check.erased_at}, {len(check.job_ids)} job(s)"
        )
    else:
        output.out.print("[red]receipt NOT verified[/]: " + escape("; ".join(check.errors)))
    if not check.ok:
        raise typer.Exit(1)
