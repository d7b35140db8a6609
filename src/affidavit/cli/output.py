"""Rendering for the CLI: JSON documents on stdout, human text via Rich, errors in one shape."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from affidavit.core.errors import (
    AffidavitError,
    ClaimRejected,
    NotFound,
    SignalRejected,
    VerificationError,
)

# Piped or redirected (no terminal, no $COLUMNS), tables are laid out 200 columns wide rather
# than Rich's 80, so that ids and hashes come out whole for the next program to read.
_PIPE_WIDTH = 200 if not sys.stdout.isatty() and "COLUMNS" not in os.environ else None
out = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NOT_FOUND = 2
EXIT_USAGE_OR_STORE = 3
EXIT_REFUSED = 5  # a claim refused before anything ran (4 is "waiting" for `run`)


def emit_json(document: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


def exit_code_for(exc: AffidavitError) -> int:
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, ClaimRejected):
        return EXIT_REFUSED
    if isinstance(exc, VerificationError | SignalRejected):
        return EXIT_FAILED
    return EXIT_USAGE_OR_STORE


def fail(exc: AffidavitError, *, as_json: bool, verbose: bool = False) -> NoReturn:
    """Report ``exc`` (message and hint; JSON error object with ``--json``) and exit."""
    if as_json:
        emit_json({"error": exc.to_dict()})
    else:
        # (a message quotes what it was given — a job id, a path — never to be read as markup)
        err.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True, highlight=False)
        if exc.hint:
            err.print(f"[dim]hint:[/] {escape(exc.hint)}")
    if verbose:
        err.print_exception(show_locals=False)
    raise typer.Exit(exit_code_for(exc))
