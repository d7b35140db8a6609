"""``affidavit log ...``: the transparency log of seals (integrate, key, checkpoint, proof,
consistency, verify; ``monitor`` is in log_monitor_cmds.py)."""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, command, opened
from affidavit.core.errors import ConfigError
from affidavit.core.note import NoteError, Verifier, parse_vkey
from affidavit.store import Store

log_app = typer.Typer(
    help="The transparency log of job seals: C2SP checkpoints, inclusion and consistency proofs.",
    no_args_is_help=True,
)

OriginOption = Annotated[
    str | None,
    typer.Option(
        "--origin",
        help="The log's origin (its name in checkpoints), fixed by the first integration. "
        "Default: $AFFIDAVIT_LOG_ORIGIN, else the stored one, else affidavit.local/log-<key>.",
        show_default=False,
    ),
]
LogKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--log-key",
        help="The log's private key file. Default: $AFFIDAVIT_LOG_KEY, else affidavit-log.key "
        "beside the seal key.",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    from affidavit.cli import log_monitor_cmds

    log_monitor_cmds.register(log_app)
    app.add_typer(log_app, name="log")


def read_vkey(value: str) -> Verifier:
    """A vkey given as text or as a file holding it.

    Raises:
        ConfigError: neither.
    """
    path = Path(value)
    text = value
    if "+" not in value and path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    try:
        return parse_vkey(text)
    except NoteError as exc:
        raise ConfigError(f"{value[:100]!r} is not a vkey: {exc.message}") from None


@log_app.command("integrate")
def integrate(
    origin: OriginOption = None,
    log_key: LogKeyOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run the sequencer once now: integrate every queued seal and sign a checkpoint.

    Exit codes: 0 done (or another sequencer holds the lease: "busy"); 3 bad origin, key or
    store error.
    """
    from affidavit.tlog import LogKey, Sequencer

    with command(as_json), opened(db) as store:
        result = Sequencer(store, LogKey.for_url(store.url, log_key), origin=origin).integrate()
    if as_json:
        output.emit_json(result.to_dict())
    elif result.busy:
        output.out.print("another sequencer holds the lease; nothing done")
    else:
        output.out.print(
            f"integrated {result.integrated} seal(s); {result.origin} is at size {result.size}"
        )
    for job_id, reason, first in result.rejected:
        what = f"a second leaf (leaf {first} is logged)" if reason == "duplicate" else reason
        output.err.print(f"refused {what} for job {job_id}", markup=False)


@log_app.command("rejected")
def rejected(
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=10000, help="At most this many.")
    ] = 100,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the queued leaves the sequencer refused, newest first: a second leaf for a job
    already in the log (`duplicate`) or a leaf whose job id is missing or not its queue row's
    (`malformed`). Each is evidence of an attempt to log a job twice; the log keeps the first.

    Exit codes: 0 listed; 3 store error.
    """
    with command(as_json), opened(db, read_only=True) as store, store.snapshot() as snap:
        found = snap.tlog_rejected(limit)
    if as_json:
        output.emit_json({"rejected": [r.to_dict() for r in found]})
        return
    if not found:
        output.out.print("no leaf was refused")
    for r in found:
        where = f" (its leaf {r.first_index} is logged)" if r.first_index is not None else ""
        output.out.print(f"{r.seq}  {r.reason}  job {r.job_id}{where}", markup=False)


@log_app.command("key")
def key(
    origin: OriginOption = None,
    log_key: LogKeyOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the log's verifier key (a signed-note vkey line) for `log verify --key`.

    Exit codes: 0 printed; 3 key or store error.
    """
    from affidavit.tlog import LogKey, configured_origin

    with command(as_json), opened(db) as store:
        lk = LogKey.for_url(store.url, log_key)
        with store.snapshot() as snap:
            stored = snap.tlog_state().origin
        name = stored or configured_origin(origin) or lk.default_origin()
        vkey = lk.verifier(name).vkey()
    if as_json:
        output.emit_json({"origin": name, "vkey": vkey})
    else:
        sys.stdout.write(vkey + "\n")


@log_app.command("checkpoint")
def checkpoint(
    size: Annotated[
        int | None, typer.Option("--size", min=0, help="A past tree size (default: the latest).")
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the latest checkpoint (a C2SP signed note, with witness cosignatures).

    Exit codes: 0 printed; 3 no checkpoint yet, or store error.
    """
    from affidavit.tlog import TransparencyLog

    with command(as_json), opened(db, read_only=True) as store:
        note = TransparencyLog(store).checkpoint(size)
    if as_json:
        output.emit_json({"checkpoint": note})
    else:
        sys.stdout.write(note)


@log_app.command("proof")
def proof(
    job_id: Annotated[str, typer.Argument(help="A sealed job's id.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the job's c2sp.org/tlog-proof@v1 (its seal's leaf, inclusion proof and the newest
    cosigned checkpoint): `affidavit log proof JOB > job.tlog-proof`.

    Exit codes: 0 printed; 2 the job is not in the log (yet); 3 store error.
    """
    from affidavit.tlog import TransparencyLog

    with command(as_json), opened(db, read_only=True) as store:
        text = TransparencyLog(store).job_proof(job_id).encode()
    if as_json:
        output.emit_json({"job_id": job_id, "proof": text})
    else:
        sys.stdout.write(text)


@log_app.command("consistency")
def consistency(
    old_size: Annotated[int, typer.Argument(help="The older tree size (≥ 1).")],
    new_size: Annotated[int, typer.Argument(help="The newer tree size.")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the RFC 9162 consistency proof between two tree sizes.

    Exit codes: 0 printed; 3 sizes out of range, or store error.
    """
    from affidavit.tlog import TransparencyLog

    with command(as_json), opened(db, read_only=True) as store:
        hashes = TransparencyLog(store).consistency(old_size, new_size)
    encoded = [base64.b64encode(h).decode() for h in hashes]
    if as_json:
        output.emit_json({"old_size": old_size, "new_size": new_size, "proof": encoded})
    else:
        sys.stdout.write("".join(h + "\n" for h in encoded))


LogUrlOption = Annotated[
    str | None,
    typer.Option(
        "--log-url",
        help="The log's base URL (as witnesses use it): read every leaf before the proof's "
        "from its tlog-tiles entry bundles, check them against the checkpoint, and refuse if "
        "one is for the same job. Without it, that the leaf is the job's first is proven only "
        "for leaf 0 (or from --db with --job).",
        show_default=False,
    ),
]


@log_app.command("verify")
def verify(
    proof_file: Annotated[Path, typer.Argument(help="A tlog-proof file ('-' for stdin).")],
    key: Annotated[str, typer.Option("--key", help="The log's vkey (text or a file).")],
    witness_key: Annotated[
        list[str] | None,
        typer.Option(
            "--witness-key",
            help="A witness's cosigner vkey (text or file); repeatable. Each one must have "
            "cosigned the checkpoint, unless --min-witnesses says how many must.",
            show_default=False,
        ),
    ] = None,
    min_witnesses: Annotated[
        int | None,
        typer.Option("--min-witnesses", min=0, help="How many of the witness keys must cosign."),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            help="Also check that the logged leaf is this job's current seal and its first leaf "
            "in the store's log (reads --db).",
            show_default=False,
        ),
    ] = None,
    log_url: LogUrlOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Verify a tlog-proof offline: the log's signature on the checkpoint, the witnesses'
    cosignatures, the inclusion of the seal's leaf, and (where it can be told) that the leaf is
    the job's first; print the earliest witness cosignature time covering the leaf.

    Exit codes: 0 verified; 1 not verified; 3 unreadable file or bad key.
    """
    from affidavit.cli._log_verify import check_job_proof, print_verdict

    with command(as_json):
        log_vkey = read_vkey(key)
        witnesses = [read_vkey(w) for w in witness_key or []]
        try:
            data = sys.stdin.buffer.read() if str(proof_file) == "-" else proof_file.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {str(proof_file)!r}: {exc.strerror}") from None
        result, sealed_at = check_job_proof(
            data, log_vkey, witnesses, min_witnesses=min_witnesses, job=job, db=db,
            log_url=log_url,
        )  # fmt: skip
    if as_json:
        output.emit_json({**result.to_dict(), "sealed_at": sealed_at})
    else:
        print_verdict(result, sealed_at)
    raise typer.Exit(0 if result.ok else 1)


SEQUENCER_ENV = "AFFIDAVIT_LOG_SEQUENCER"


@contextmanager
def background_sequencer(store: Store, *, final: bool = True) -> Iterator[None]:
    """Run the log's sequencer in a thread while the body runs (workers and the server: every
    seal is integrated within about a second), and once more at the end when ``final``, so a
    worker that exits leaves its seals integrated. ``$AFFIDAVIT_LOG_SEQUENCER=off`` turns it
    off (then run `affidavit log integrate` somewhere)."""
    import logging

    from affidavit.core.errors import AffidavitError
    from affidavit.tlog import LogKey, Sequencer

    if os.environ.get(SEQUENCER_ENV, "").lower() in ("off", "0", "false", "no"):
        yield
        return
    sequencer = Sequencer(store, LogKey.for_url(store.url))
    thread, stop = sequencer.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if final:
            try:
                sequencer.integrate()
            except AffidavitError as exc:
                logging.getLogger(__name__).warning("log integration failed: %s", exc.message)
