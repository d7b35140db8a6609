"""``affidavit pack export | verify`` and the alias ``affidavit rce-verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.packs import export_pack

pack_app = typer.Typer(help="Proof packs: signed RCE v0.1 exports of jobs.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(pack_app, name="pack")


@pack_app.command("export")
def export(
    job_id: Annotated[str, typer.Argument(help="The job id (a finished job).")],
    out_dir: Annotated[Path, typer.Argument(help="The pack directory to create.")],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace OUT_DIR if it exists.")
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Export a finished job as a signed RCE v0.1 proof pack (verifiable offline by
    `affidavit pack verify` and by `assay rce-verify`).

    Exit codes: 0 written; 2 no such job; 3 unfinished job, OUT_DIR exists, no signing key, or
    store error.
    """
    with command(as_json), opened(db) as store:
        result = export_pack(store, job_id, out_dir, overwrite=overwrite)
    if as_json:
        output.emit_json(result.to_dict())
    else:
        output.out.print(f"wrote {result.pack_dir} (pack root {result.pack_root_sha256})")
