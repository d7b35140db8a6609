"""``affidavit disclose JOB --step S`` and ``affidavit disclose verify FILE --key K``: one step
of a sealed job, shown with proofs against its v2 seal and verified offline (see
:mod:`affidavit.tlog`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, WitnessKeysOption, command, opened
from affidavit.cli.log_cmds import LogUrlOption, read_vkey
from affidavit.cli.pack_cmds import _load_key
from affidavit.core.errors import ConfigError


class _JobFirst(TyperGroup):
    """``affidavit disclose JOB ...`` is ``affidavit disclose job JOB ...``: a first word that
    is no subcommand (a job id) goes to the ``job`` command."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["job", *args]
        return super().parse_args(ctx, args)


disclose_app = typer.Typer(
    cls=_JobFirst,
    help="Disclose one step of a sealed job, provable offline without its other steps: "
    "`affidavit disclose JOB --step STEP > step.json`, then "
    "`affidavit disclose verify step.json --key VKEY`.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(disclose_app, name="disclose")


@disclose_app.command("job")
def disclose_job(
    job_id: Annotated[str, typer.Argument(help="A sealed (v2) job's id.")],
    step: Annotated[
        str | None,
        typer.Option(
            "--step",
            help="The step to disclose (every event of it): a plan node id, an agent step's "
            "number (3 or #3, as `jobs trace` lists it) or a step id.",
            show_default=False,
        ),
    ] = None,
    event: Annotated[
        int | None,
        typer.Option(
            "--event",
            min=1,
            help="Instead of --step: the event of this version alone (see `jobs events`).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write the file here (default: stdout).", show_default=False),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write a disclosure file (JSON): the step's events (--step) or one event (--event),
    each with the previous chain hash and its inclusion proof against the seal's events root,
    the signed seal, and the job's transparency-log proof when the job is in the log. Nothing
    else of the job is in it. `affidavit disclose JOB` is short for `affidavit disclose job JOB`.

    Exit codes: 0 written; 1 the stored log does not match its seal; 2 no such job, the job
    is not sealed or has a v1 seal, no such step or event, or a number as --step of a plan
    job; 3 neither or both of --step and --event, store error or unwritable --out.
    """
    from affidavit.tlog import disclose, encode_disclosure

    with command(as_json), opened(db, read_only=True) as store:
        data = encode_disclosure(disclose(store, job_id, step=step, event=event))
        if out is not None:
            try:
                out.write_bytes(data)
            except OSError as exc:
                raise ConfigError(f"cannot write {str(out)!r}: {exc.strerror}") from None
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    elif as_json:
        shown = {"step": step} if event is None else {"event": event}
        output.emit_json({"job_id": job_id, **shown, "out": str(out), "bytes": len(data)})
    else:
        output.err.print(f"wrote {len(data)} bytes to {out}", markup=False)


@disclose_app.command("verify")
def verify(
    file: Annotated[Path, typer.Argument(help="A disclosure file ('-' for stdin).")],
    key: Annotated[
        list[str],
        typer.Option(
            "--key",
            help="The seal verifier key: a base64 Ed25519 public key or a file holding one "
            "(PEM or base64), as `affidavit keys show` prints it; repeatable.",
        ),
    ],
    log_key: Annotated[
        str | None,
        typer.Option(
            "--log-key",
            help="Also check the job's transparency-log proof against this log vkey (text or "
            "file): the seal must be the one the log holds for the job.",
            show_default=False,
        ),
    ] = None,
    witness_key: WitnessKeysOption = None,
    log_url: LogUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Verify a disclosure file offline: the seal's signature, each event's chain hash and
    its inclusion in the sealed events root, and with --log-key the job's transparency-log
    proof (and --witness-key cosignatures).

    Exit codes: 0 verified; 1 not verified; 3 bad key or unreadable file.
    """
    from affidavit.tlog import MAX_DISCLOSURE_BYTES, verify_disclosure

    with command(as_json):
        for given, name in ((witness_key, "--witness-key"), (log_url, "--log-url")):
            if given and not log_key:
                raise ConfigError(f"{name} needs --log-key")
        seal_keys = [_load_key(k) for k in key]
        log_vkey = read_vkey(log_key) if log_key else None
        witnesses = [read_vkey(w) for w in witness_key or []]
        data = _read_bounded(file, MAX_DISCLOSURE_BYTES)
        result = verify_disclosure(
            data, seal_keys, log_key=log_vkey, witnesses=witnesses, log_url=log_url
        )
    if as_json:
        output.emit_json(result.to_dict())
    elif result.ok:
        _print_proven(result.to_dict())
    else:
        output.err.print(f"not verified: {result.error}", markup=False)
    raise typer.Exit(0 if result.ok else 1)


def _read_bounded(file: Path, limit: int) -> bytes:
    """The file's bytes, or one byte more than ``limit`` when it is larger (read no further:
    the verifier then refuses it by its size)."""
    try:
        if str(file) == "-":
            return sys.stdin.buffer.read(limit + 1)
        with file.open("rb") as f:
            return f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {str(file)!r}: {exc.strerror}") from None


def _print_proven(doc: dict[str, Any]) -> None:
    seal = doc["seal"]
    lines = [
        f"verified: {len(doc['events'])} event(s) of step {doc['selector']!r} of job "
        f"{doc['job_id']}, in its log of {seal['event_count']} events sealed at "
        f"{seal['sealed_at']} by key {seal['key_id']}"
    ]
    for event in doc["events"]:
        lines.append(f"  event {event['version']}: {event['type']}")
    log = doc["log"]
    if log["checked"]:
        lines.append(
            f"  the seal is leaf {log['index']} of {log['origin']} at checkpoint size "
            f"{log['tree_size']}"
            + (f", cosigned by {', '.join(log['witnesses'])}" if log["witnesses"] else "")
        )
        first = {True: "yes", False: "no", None: "not proven"}[log["first_for_job"]]
        lines.append(f"  first leaf for the job: {first} ({log['first_checked']})")
        if log["earliest_cosigned"] is not None:
            c = log["earliest_cosigned"]
            lines.append(f"  earliest cosigned: {c['at']} by {c['witness']}")
    else:
        lines.append(
            "  transparency log: not checked (pass --log-key)"
            if log["present"]
            else "  transparency log: no proof in the file"
        )
    output.out.print("\n".join(lines), markup=False, highlight=False)
