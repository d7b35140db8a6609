"""``affidavit log monitor``: audit a served log from its tiles, for auditors who trust nobody
who runs it (see tlog/_monitor.py)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from affidavit.cli import output
from affidavit.cli.common import JsonOption, command
from affidavit.cli.log_cmds import read_vkey

PROGRESS_EVERY = 10_000  # entries between two progress lines on stderr
MAX_INTERVAL_S = 86_400.0


def register(log_app: typer.Typer) -> None:
    """Add ``monitor`` to the ``log`` group (once)."""
    if not any(c.name == "monitor" for c in log_app.registered_commands):
        log_app.command("monitor")(monitor)


def _line(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class _Progress:
    """``monitor: audited N of M new entries`` on stderr, every :data:`PROGRESS_EVERY`."""

    def __init__(self) -> None:
        self.shown = 0

    def __call__(self, done: int, total: int) -> None:
        if total < PROGRESS_EVERY:
            return
        if done - self.shown >= PROGRESS_EVERY or done == total:
            self.shown = done
            sys.stderr.write(f"monitor: audited {done} of {total} new entries\n")
            sys.stderr.flush()


def monitor(
    log_url: Annotated[
        str, typer.Option("--log-url", help="The log's base URL (affidavit serve).")
    ],
    log_key: Annotated[str, typer.Option("--log-key", help="The log's vkey (text or a file).")],
    state: Annotated[
        Path,
        typer.Option("--state", help="The monitor's state directory (its index and state)."),
    ],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow/--once",
            help="Keep following the log (a step every --interval seconds) until SIGINT or "
            "SIGTERM; default: one step, then exit.",
        ),
    ] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval", min=0.1, max=MAX_INTERVAL_S, help="Seconds between steps (--follow)."
        ),
    ] = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Audit the log from its tiles: each step reads the latest checkpoint, verifies the log's
    signature and its consistency with the last one verified, reads every new entry, checks
    that the entries hash to the signed root, and that each is a well-formed leaf naming a job
    id not seen before (a durable index in --state). Prints one JSON line per record on stdout:
    {"kind": "checkpoint", ...} per checkpoint verified, and one per problem found ("fork",
    "duplicate_job", "malformed_leaf", "entries_mismatch", "bad_checkpoint"), with an evidence
    file in the state directory. Progress of a long catch-up goes to stderr.

    Exit codes: 0 no problem found; 1 a problem found (in any step); 3 log unreachable
    (--once), bad key or state (with --json, as a JSON error on stdout).
    """
    from affidavit.tlog import MONITOR_PROBLEMS, AuditInterrupted, LogReadError, Monitor

    stop = threading.Event()
    found = False
    with command(as_json):
        mon = Monitor(
            state,
            log_url=log_url,
            log_key=read_vkey(log_key),
            progress=_Progress(),
            should_stop=stop.is_set,
        )
        previous = _on_signals(stop) if follow else None
        try:
            while not stop.is_set():
                try:
                    records = mon.step()
                except LogReadError as exc:
                    if not follow:
                        raise
                    sys.stderr.write(f"monitor: {exc.message}\n")
                    records = []
                except AuditInterrupted:
                    break
                for record in records:
                    found = found or record["kind"] in MONITOR_PROBLEMS
                    _line(record)
                if not follow or stop.wait(interval):
                    break
        finally:
            if previous is not None:
                _restore(previous)
            mon.close()
    if found:
        raise typer.Exit(output.EXIT_FAILED)


_Handler = Any


def _on_signals(stop: threading.Event) -> tuple[_Handler, _Handler]:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    return signal.signal(signal.SIGINT, handler), signal.signal(signal.SIGTERM, handler)


def _restore(previous: tuple[_Handler, _Handler]) -> None:
    signal.signal(signal.SIGINT, previous[0])
    signal.signal(signal.SIGTERM, previous[1])
