"""``affidavit verify`` (Verification Mode) and ``affidavit keys show | rotate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.runtime.sealing import KEY_ENV, Sealer, SigningKey
from affidavit.store import Store
from affidavit.verify import VerificationResult, verify_job

keys_app = typer.Typer(help="The key that signs job seals.", no_args_is_help=True)

KeyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        help=f"The signing key file. Default: ${KEY_ENV}, else affidavit-signing.key next to "
        "the SQLite database (PostgreSQL: ~/.local/share/affidavit/).",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
    app.add_typer(keys_app, name="keys")


def verify(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    trusted_key: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-key",
            help="Accept seals only from this key: a base64 public key, or the key id of a key "
            "recorded in the database. Repeatable. Default: every recorded key.",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Verify a job (any status) without changing anything: execution hash, event chain root,
    tool-invocation ledger proof, replay proof, stored chain and seal.

    Exit codes: 0 every check holds; 1 some check failed; 2 no such job; 3 usage or store
    error.
    """
    with command(as_json), opened(db) as store:
        result = verify_job(store, job_id, trusted_keys=trusted_key or None)
    if as_json:
        output.emit_json(result.to_dict())
    else:
        render(result)
    if not result.ok:
        raise typer.Exit(output.EXIT_FAILED)


def render(result: VerificationResult) -> None:
    table = Table(title=f"job {result.job_id} ({result.status})", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for check in result.checks():
        mark = "[green]✓[/]" if check.ok else "[bold red]✗[/]"
        table.add_row(check.name, mark, check.detail)
    output.out.print(table)
    if result.ok:
        output.out.print("[green]verified[/]: every check holds")
    else:
        failed = ", ".join(c.name for c in result.checks() if not c.ok)
        output.out.print(f"[bold red]NOT verified[/]: {failed} failed")


def _sealer(store: Store, key_file: Path | None) -> Sealer:
    return Sealer(key_file) if key_file is not None else Sealer.for_store(store)


def _key_doc(key: SigningKey, store: Store) -> dict[str, Any]:
    return {
        "key_id": key.key_id,
        "algorithm": "ed25519",
        "public_key": key.public.public_key_b64,
        "path": str(key.path) if key.path is not None else None,
        "keys": [k.to_dict() for k in store.signing_keys()],
    }


@keys_app.command("show")
def keys_show(
    key_file: KeyFileOption = None, db: DbOption = None, as_json: JsonOption = False
) -> None:
    """Print the signing key's public key and key id (creating the key if there is none yet),
    and every public key recorded in the database.

    Exit codes: 0 shown; 3 the key file or the database cannot be used.
    """
    with command(as_json), opened(db) as store:
        key = _sealer(store, key_file).register(store)
        doc = _key_doc(key, store)
    if as_json:
        output.emit_json(doc)
        return
    output.out.print(f"key id:     {doc['key_id']}")
    output.out.print(f"public key: {doc['public_key']} (ed25519, base64)")
    output.out.print(f"key file:   {doc['path']}")
    _print_recorded(doc["keys"])


@keys_app.command("rotate")
def keys_rotate(
    key_file: KeyFileOption = None, db: DbOption = None, as_json: JsonOption = False
) -> None:
    """Replace the signing key with a new one. The old public key stays recorded (retired), so
    seals it signed still verify; the old key file is kept as <file>.retired-<key id>.
    Running workers keep their loaded key until they restart.

    Exit codes: 0 rotated; 3 the key file or the database cannot be used.
    """
    with command(as_json), opened(db) as store:
        old, new = _sealer(store, key_file).rotate(store)
        doc = _key_doc(new, store)
    doc["retired_key_id"] = old.key_id if old is not None else None
    if as_json:
        output.emit_json(doc)
        return
    retired = f" (retired {doc['retired_key_id']})" if old is not None else ""
    output.out.print(f"new key id: {doc['key_id']}{retired}")
    output.out.print(f"public key: {doc['public_key']} (ed25519, base64)")
    _print_recorded(doc["keys"])


def _print_recorded(keys: list[dict[str, Any]]) -> None:
    table = Table("key_id", "public_key", "created_at", "retired_at", title="recorded keys")
    for k in keys:
        table.add_row(k["key_id"], k["public_key"], k["created_at"] or "", k["retired_at"] or "")
    output.out.print(table)
