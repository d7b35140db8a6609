"""``affidavit keys show | list | trust | rotate``: the keys that seal jobs, and the ones the
database accepts.

A database accepts the seal keys registered in it: the first key that seals in an empty
database registers itself, any other one is registered by an operator (``trust`` for another
host's key, ``rotate`` for a new key here). Registering is an operator's act, not an
auditor's: ``affidavit verify --trusted-key`` and a pack's verification pin the keys an
auditor trusts, whatever the database lists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.core.errors import ConfigError
from affidavit.core.seal import PublicKey
from affidavit.core.signing import KEY_ENV, SigningKey, public_key_of
from affidavit.record import Sealer, key_status, trust_key
from affidavit.store import Store

keys_app = typer.Typer(
    help="The key that signs job seals, and the keys the database accepts.", no_args_is_help=True
)

KeyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        help=f"The signing key file. Default: ${KEY_ENV}, else affidavit-signing.key next to "
        "the SQLite database (PostgreSQL: $XDG_DATA_HOME/affidavit/, default "
        "~/.local/share/affidavit/).",
        show_default=False,
    ),
]


def _sealer(store: Store, key_file: Path | None) -> Sealer:
    return Sealer(key_file) if key_file is not None else Sealer.for_store(store)


def _registered(store: Store) -> list[dict[str, Any]]:
    return [_key_row(k) for k in store.signing_keys()]


def _key_row(key: PublicKey) -> dict[str, Any]:
    doc = key.to_dict()
    doc["added_at"] = key.created_at
    doc["status"] = key_status(key)
    return doc


def _status_in(key: SigningKey, keys: list[dict[str, Any]]) -> str:
    found = next((k for k in keys if k["key_id"] == key.key_id), None)
    if found is None:
        return "unregistered"
    if found["public_key"] != key.public.public_key_b64:
        return "mismatch"
    return str(found["status"])


def _key_doc(key: SigningKey, store: Store) -> dict[str, Any]:
    keys = _registered(store)
    return {
        "key_id": key.key_id,
        "algorithm": "ed25519",
        "public_key": key.public.public_key_b64,
        "path": str(key.path) if key.path is not None else None,
        "status": _status_in(key, keys),
        "keys": keys,
    }


@keys_app.command("show")
def keys_show(
    key_file: KeyFileOption = None, db: DbOption = None, as_json: JsonOption = False
) -> None:
    """Print this host's signing key (its public key and key id; the key is created if there
    is none yet), whether the database accepts it (status: active, retired, unregistered), and
    every key the database accepts. Registers nothing: the first key that seals in an empty
    database registers itself; `keys trust` registers another. A --key-file that does not exist
    is an error, not a new key: create one there with `affidavit keys rotate --key-file PATH`.

    Exit codes: 0 shown; 3 the key file or the database cannot be used.
    """
    with command(as_json):
        if key_file is not None and not key_file.exists():
            raise ConfigError(
                f"no signing key at {str(key_file)!r}",
                hint="Check the path; `affidavit keys rotate --key-file PATH` creates a key there.",
            )
    with command(as_json), opened(db) as store:
        doc = _key_doc(_sealer(store, key_file).key(), store)
    if as_json:
        output.emit_json(doc)
        return
    output.out.print(f"key id:     {doc['key_id']}")
    output.out.print(f"public key: {doc['public_key']} (ed25519, base64)")
    output.out.print(f"key file:   {escape(str(doc['path']))}")
    output.out.print(f"status:     {doc['status']} in this database")
    _print_recorded(doc["keys"])


@keys_app.command("list")
def keys_list(db: DbOption = None, as_json: JsonOption = False) -> None:
    """List the seal keys the database accepts: key id, public key, when it was added, status
    (active: may seal in a process started now; retired: verifies the seals it made only).

    Exit codes: 0 listed; 3 the database cannot be used.
    """
    with command(as_json), opened(db, read_only=True) as store:
        keys = _registered(store)
    if as_json:
        output.emit_json({"keys": keys})
        return
    if not keys:
        output.out.print("no seal key is registered yet: the first one that seals registers")
        return
    _print_recorded(keys)


@keys_app.command("trust")
def keys_trust(
    key: Annotated[
        str,
        typer.Argument(
            metavar="KEYFILE_OR_PUBKEY",
            help="The key to accept: the base64 public key `affidavit keys show` prints on "
            "its host, a PEM public key file, or the key file itself.",
            show_default=False,
        ),
    ],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register another host's seal key, so that workers holding it may seal here (an
    operator's act: whoever can write the database can register a key, so auditors pin the
    keys they trust with `verify --trusted-key`). A key already registered is left as it is.

    Exit codes: 0 registered (or already); 3 not a key, or the database cannot be used.
    """
    with command(as_json):
        public = public_key_of(key)
        with opened(db) as store:
            before = trust_key(store, public)
            keys = _registered(store)
    doc = {
        "key_id": public.key_id,
        "public_key": public.public_key_b64,
        "registered": before == "unregistered",
        "status": "active" if before == "unregistered" else before,
        "keys": keys,
    }
    if as_json:
        output.emit_json(doc)
        return
    if doc["registered"]:
        output.out.print(f"registered key {public.key_id}: workers holding it may seal here")
    else:
        output.out.print(f"key {public.key_id} was already registered ({before}): unchanged")
    _print_recorded(keys)


@keys_app.command("rotate")
def keys_rotate(
    key_file: KeyFileOption = None, db: DbOption = None, as_json: JsonOption = False
) -> None:
    """Replace this host's signing key with a new one and register it as active. The old key,
    if the database accepted it, is retired: its seals still verify, and it seals nothing new
    in a process started from now on (one already running keeps it until it restarts). The
    old key file is kept as <file>.retired-<key id>.

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
    table = Table(title="registered keys")
    table.add_column("key_id", no_wrap=True, min_width=16)
    table.add_column("status", no_wrap=True)
    table.add_column("public_key", overflow="fold")
    table.add_column("added_at")
    table.add_column("retired_at")
    for k in keys:
        table.add_row(
            escape(str(k["key_id"])),
            k["status"],
            escape(k["public_key"]),
            escape(k["added_at"] or ""),
            escape(k["retired_at"] or ""),
        )
    output.out.print(table)
