"""``affidavit witness run | key``: a witness that follows a log over HTTP and cosigns it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import JsonOption, command
from affidavit.cli.log_cmds import read_vkey

witness_app = typer.Typer(
    help="A witness: follows a transparency log over HTTP, checks each checkpoint's "
    "consistency with the last one it cosigned and audits its new entries, cosigns it, and "
    "refuses a fork or a second leaf for a job.",
    no_args_is_help=True,
)

StateOption = Annotated[
    Path, typer.Option("--state", help="The witness's state directory (its key and state).")
]
NameOption = Annotated[
    str, typer.Option("--name", help="The witness's key name, e.g. witness.example.org/w1.")
]
API_KEY_ENV = "AFFIDAVIT_WITNESS_API_KEY"


def register(app: typer.Typer) -> None:
    app.add_typer(witness_app, name="witness")


@witness_app.command("key")
def key(state: StateOption, name: NameOption, as_json: JsonOption = False) -> None:
    """Print the witness's cosigner vkey (creating its key on first use), for
    `affidavit log verify --witness-key`.

    Exit codes: 0 printed; 3 unusable state directory or name.
    """
    from affidavit.core.note import COSIGNATURE_V1, NoteSigner
    from affidavit.tlog import Witness

    with command(as_json):
        vkey = NoteSigner(name, Witness.key(state).private, COSIGNATURE_V1).verifier.vkey()
    if as_json:
        output.emit_json({"name": name, "vkey": vkey})
    else:
        sys.stdout.write(vkey + "\n")


@witness_app.command("run")
def run(
    state: StateOption,
    name: NameOption,
    log_url: Annotated[
        str, typer.Option("--log-url", help="The log's base URL (affidavit serve).")
    ],
    log_key: Annotated[str, typer.Option("--log-key", help="The log's vkey (text or a file).")],
    once: Annotated[bool, typer.Option("--once", help="One step, then exit.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between steps.")
    ] = 5.0,
    as_json: JsonOption = False,
) -> None:
    """Follow the log: each step fetches its checkpoint, checks it against the last one
    cosigned (a consistency proof), audits the new entries (they must hash to the signed root,
    be well-formed leaves, and each name a job id not seen before), cosigns it and hands the
    cosignature back to the log (with the admin API key in $AFFIDAVIT_WITNESS_API_KEY). A fork,
    a duplicate job or a malformed leaf is refused and reported (fork_detected, duplicate_job,
    malformed_leaf), with an evidence file in the state directory.

    Exit codes: 0 done (--once) or stopped; 1 a fork, a duplicate job, a malformed leaf or
    entries that do not match the signed root; 3 log unreachable, bad key or state.
    """
    from affidavit.tlog import LogReadError, Witness, WitnessError

    with command(as_json):
        witness = Witness(
            state,
            name,
            log_url=log_url,
            log_key=read_vkey(log_key),
            api_key=os.environ.get(API_KEY_ENV) or None,
        )
        try:
            while True:
                try:
                    result = witness.step()
                except (WitnessError, LogReadError) as exc:
                    if once:
                        raise
                    output.err.print(f"witness: {exc.message}", markup=False)
                else:
                    if as_json:
                        output.emit_json(result.to_dict())
                    elif result.cosigned:
                        output.err.print(f"cosigned {result.origin} at size {result.size}")
                if once:
                    break
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
        finally:
            witness.close()
