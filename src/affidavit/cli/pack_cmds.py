"""``affidavit pack export | verify`` and the alias ``affidavit rce-verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from affidavit.cli import output
from affidavit.cli.common import DbOption, JsonOption, WitnessKeysOption, command, opened, state
from affidavit.cli.log_cmds import LogUrlOption, read_vkey
from affidavit.core.errors import ConfigError
from affidavit.core.inputs import read_limited
from affidavit.core.seal import unb64

# affidavit.packs (its schemas and both pack codecs) is imported by the two commands that use
# it: every other command starts without paying for it.

pack_app = typer.Typer(help="Proof packs: signed RCE v0.1 exports of jobs.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(pack_app, name="pack")
    app.command("rce-verify")(verify)


@pack_app.command("export")
def export(
    job_id: Annotated[str, typer.Argument(help="The job id (a finished job).")],
    out_dir: Annotated[Path, typer.Argument(help="The pack directory to create.")],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace OUT_DIR if it exists.")
    ] = False,
    tree: Annotated[
        bool,
        typer.Option(
            "--tree",
            help="Also export every descendant (child jobs): OUT_DIR/<job id>/ per job and "
            "OUT_DIR/tree.json; check it with `pack verify OUT_DIR --tree`.",
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Export a finished job as a signed RCE v0.1 proof pack (verifiable offline by
    `affidavit pack verify` and by `assay rce-verify`).

    Exit codes: 0 written; 2 no such job; 3 unfinished job, OUT_DIR exists, no signing key, an
    event row changed outside affidavit (replay_error), or store error.
    """
    from affidavit.packs import export_pack, export_tree

    if tree:
        with command(as_json), opened(db) as store:
            doc = export_tree(store, job_id, out_dir, overwrite=overwrite)
        if as_json:
            output.emit_json(doc)
        else:
            output.out.print(f"wrote {out_dir}: {len(doc['jobs'])} packs and tree.json")
        return
    with command(as_json), opened(db) as store:
        result = export_pack(store, job_id, out_dir, overwrite=overwrite)
    if as_json:
        output.emit_json(result.to_dict())
    else:
        output.out.print(f"wrote {result.pack_dir} (pack root {result.pack_root_sha256})")
    if result.assay_diverging_steps:  # (on stderr, with --json too)
        steps = result.assay_diverging_steps
        output.err.print(
            f"[yellow]note[/]: the traces of {len(steps)} step(s) ({', '.join(steps)}) hold "
            "numbers in exponent form (such as 1e-7 or 1e+21); assay's verifier writes those "
            "otherwise than RFC 8785 and reports these steps as diverging. The pack is correct: "
            "`affidavit pack verify` checks it exactly.",
            highlight=False,
        )


# Long because typer reads the command's options from its signature and its --help from its
# docstring (so this reason is not there); the body itself is under 50 lines.
def verify(
    pack_dir: Annotated[
        Path, typer.Argument(help="The pack directory, or a pack archive (.tar.gz).")
    ],
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out-dir",
            help="Where to write rce_replay_result.json and rce_replay_details.json.",
        ),
    ],
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Write into OUT_DIR even if it exists.")
    ] = False,
    pretty: Annotated[bool, typer.Option("--pretty", help="Indent the written JSON.")] = False,
    trusted_key: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-key",
            help="Accept only packs signed by this key, with a job seal signed by one of "
            "these keys: a base64 public key or a file holding one (PEM or base64). "
            "Repeatable. Default: the keys the pack carries (self-attested).",
            show_default=False,
        ),
    ] = None,
    max_file_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-file-bytes",
            min=1,
            help="The most bytes one file of the pack may hold (a larger one is "
            "INTEGRITY_FAIL, refused by its size before it is read). "
            "Default: $AFFIDAVIT_PACK_MAX_FILE_BYTES, else 256 MiB.",
            show_default=False,
        ),
    ] = None,
    log_key: Annotated[
        str | None,
        typer.Option(
            "--log-key",
            help="Also check the job's transparency-log proof (log.tlog-proof) against this "
            "log vkey (text or file): the log's signature and the inclusion of the pack's seal.",
            show_default=False,
        ),
    ] = None,
    witness_key: WitnessKeysOption = None,
    log_url: LogUrlOption = None,
    tree: Annotated[
        bool,
        typer.Option(
            "--tree",
            help="PACK_DIR is a tree (`pack export --tree`): verify every job's pack (each "
            "verdict under OUT_DIR/<job id>/) and that each child's pack is the job its "
            "parent recorded; exit 2 when a link does not hold.",
        ),
    ] = False,
    source: Annotated[
        Path | None,
        typer.Option(
            "--source",
            help="PACK_DIR is a fork's pack: also check the steps it reused against this pack "
            "of its source job (a directory or archive); a prefix the source does not hold is "
            "INTEGRITY_FAIL. Without it a fork's reused steps are reported 'source not "
            "checked'.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Verify a proof pack offline (RCE v0.1 phases 1-4, and the job's event log, seal and
    ledger when the pack carries them; with --log-key, its transparency-log proof). A JSON file
    of the pack giving a key twice in one object is INTEGRITY_FAIL (readers would disagree on
    its value).

    PACK_DIR may be a pack archive (.tar.gz, as GET /api/jobs/{id}/pack gives): it is read
    whole and checked first (gzip trailer, every tar block, bounded members, no links, absolute
    paths or '..'); a corrupted or refused archive is INTEGRITY_FAIL naming the corruption.

    Exit codes: 0 MATCH; 1 DIVERGE; 2 INTEGRITY_FAIL; 3 usage error, no such pack directory
    or archive, or OUT_DIR exists without --overwrite.
    """
    from affidavit.packs import verify_pack, write_verdict

    if tree:
        _verify_tree(pack_dir, out_dir, overwrite, pretty, trusted_key, max_file_bytes, as_json)
        return
    with command(as_json):
        if not (pack_dir.is_dir() or pack_dir.is_file()):
            raise ConfigError(f"no pack directory or archive at {str(pack_dir)!r}")
        if out_dir.exists() and not overwrite:
            raise ConfigError(
                f"{str(out_dir)!r} already exists", hint="Remove it first or pass --overwrite."
            )
        keys = [_load_key(k) for k in trusted_key] if trusted_key else None
        for given, name in ((witness_key, "--witness-key"), (log_url, "--log-url")):
            if given and not log_key:
                raise ConfigError(f"{name} needs --log-key")
        verdict = verify_pack(
            pack_dir,
            trusted_keys=keys,
            max_file_bytes=max_file_bytes,
            log_key=read_vkey(log_key) if log_key else None,
            witness_keys=[read_vkey(w) for w in witness_key or []],
            log_url=log_url,
            fork_source=source,
        )
        receipt_path, details_path = write_verdict(verdict, out_dir, pretty=pretty)
    document = {
        "command": "rce-verify",
        "status": "ok",
        "verdict": verdict.verdict,
        "receipt_path": str(receipt_path),
        "details_path": str(details_path),
        "exit_code": verdict.exit_code,
    }
    fork = verdict.details.get("fork")
    if fork is not None:
        document["fork"] = fork
    if as_json:
        output.emit_json(document)
    else:
        colour = {"MATCH": "green", "DIVERGE": "yellow"}.get(verdict.verdict, "bold red")
        output.out.print(f"rce verdict: [{colour}]{verdict.verdict}[/]")
        for error in verdict.errors[:20]:
            output.out.print(f"  - {error}", markup=False)
        if fork is not None:  # (ids from the pack: printed as text, never markup)
            said = fork.get("reason") or fork.get("problem") or "the source's pack holds them"
            output.out.print(
                f"fork of job {fork.get('source_job_id')} up to step {fork.get('step')}: "
                f"{fork.get('status')} — {said}",
                markup=False,
            )
        output.out.print(f"wrote: {receipt_path}\nwrote: {details_path}")
    raise typer.Exit(verdict.exit_code)


def _verify_tree(
    pack_dir: Path,
    out_dir: Path,
    overwrite: bool,
    pretty: bool,
    trusted_key: list[str] | None,
    max_file_bytes: int | None,
    as_json: bool,
) -> None:
    """``pack verify DIR --tree``: each job's verdict written under OUT_DIR/<job id>/."""
    from affidavit.packs import verify_tree_packs, write_verdict

    with command(as_json):
        if not pack_dir.is_dir():
            raise ConfigError(f"no pack directory at {str(pack_dir)!r}")
        if out_dir.exists() and not overwrite:
            raise ConfigError(
                f"{str(out_dir)!r} already exists", hint="Remove it first or pass --overwrite."
            )
        keys = [_load_key(k) for k in trusted_key] if trusted_key else None
        verdict = verify_tree_packs(pack_dir, trusted_keys=keys, max_file_bytes=max_file_bytes)
        for job_id, each in verdict.packs.items():
            write_verdict(each, out_dir / job_id, pretty=pretty)
    code = max((v.exit_code for v in verdict.packs.values()), default=2)
    code = 0 if verdict.ok else max(code, 2 if verdict.problems else 1)
    if as_json:
        output.emit_json({**verdict.to_dict(), "exit_code": code})
    else:
        shown = "MATCH" if verdict.ok else "FAIL"
        output.out.print(f"tree verdict: {shown} ({len(verdict.packs)} packs)")
        for problem in verdict.problems[:20]:
            output.out.print(f"  - {problem}", markup=False)
    raise typer.Exit(code)


def _load_key(value: str) -> bytes:
    """A trusted key: base64 of a raw 32-byte key, or a file with one (PEM public/private key
    or base64)."""
    path = Path(value)
    text = value
    if path.is_file():
        data = read_limited(path, "--trusted-key file", limit=state.max_input_bytes)
        if b"-----BEGIN" in data:
            try:
                loaded: Any = serialization.load_pem_public_key(data)
            except ValueError:
                try:
                    loaded = serialization.load_pem_private_key(data, password=None).public_key()
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"{value!r} is not an Ed25519 key: {exc}") from None
            if not isinstance(loaded, Ed25519PublicKey):  # an RSA or EC key has no raw form
                raise ConfigError(f"{value!r} is not an Ed25519 key but {type(loaded).__name__}")
            return bytes(
                loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            )
        text = data.decode("ascii", "replace").strip()
    try:
        raw = unb64(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ConfigError(f"--trusted-key {value!r} is neither a base64 key nor a key file")
    return raw


pack_app.command("verify")(verify)
