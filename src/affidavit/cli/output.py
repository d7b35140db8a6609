"""Rendering for the CLI: JSON documents on stdout, human text via Rich, errors in one shape."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from affidavit.core.errors import AffidavitError

# The exit codes (4 is "waiting" for `run`), and the one for each error: the faces' table.
from affidavit.faces.errors import EXIT_FAILED as EXIT_FAILED
from affidavit.faces.errors import EXIT_NOT_FOUND as EXIT_NOT_FOUND
from affidavit.faces.errors import EXIT_REFUSED as EXIT_REFUSED
from affidavit.faces.errors import EXIT_USAGE_OR_STORE as EXIT_USAGE_OR_STORE
from affidavit.faces.errors import exit_code_for as exit_code_for

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    out: Console  # human output (stdout)
    err: Console  # notes, progress and errors (stderr)

# Piped or redirected (no terminal, no $COLUMNS), tables are laid out 200 columns wide rather
# than Rich's 80, so that ids and hashes come out whole for the next program to read.
_PIPE_WIDTH = 200 if not sys.stdout.isatty() and "COLUMNS" not in os.environ else None


def __getattr__(name: str) -> Any:
    """``out`` and ``err``, the Rich consoles, made on first use: a command run with
    ``--json`` prints through neither, and does not import Rich (~20 ms of its start)."""
    if name not in ("out", "err"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _console(name)


def _console(name: str) -> Console:
    """The console ``out`` or ``err``, made (and kept as the module's attribute) if needed."""
    made: Console | None = globals().get(name)
    if made is None:
        from rich.console import Console

        if name == "out":
            made = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
        else:
            made = Console(stderr=True, highlight=False, soft_wrap=True)
        globals()[name] = made
    return made


def escape(text: str) -> str:
    """Rich's markup escape (Rich imported on first use)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def table(*headers: str, **options: Any) -> Table:
    """A Rich table of ``headers`` (``options`` as :class:`rich.table.Table` takes them), Rich
    imported on first use: a command imports it only when it prints one."""
    from rich.table import Table

    return Table(*headers, **options)


# Rich lays a table out whole before it prints a line of it, at about a quarter of a millisecond
# a row (seconds for a long log): a table of more rows is printed as plain aligned columns.
RICH_TABLE_ROWS = 1_000
# control characters (C0, DEL, C1) as "?" in plain columns, which print text as it is: a row
# edited outside the store must not move the cursor or send escape sequences to the terminal
_CONTROL = dict.fromkeys((*range(0x20), *range(0x7F, 0xA0)), "?")

# A value printed in human output (a job's output or error, a cell of `jobs show`) longer than
# this many characters is cut, with a note: Rich lays out and highlights text at about a
# megabyte in several seconds, and nobody reads megabytes on a terminal. --json prints it whole.
SHOWN_CHARS = 10_000

EXIT_OK = 0


def emit_json(document: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


def plain(text: str) -> None:
    """Print ``text`` as it is, and a newline, on stdout: for a value printed alone (a job id),
    which a script reads, without loading Rich for it."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def fail(exc: AffidavitError, *, as_json: bool, verbose: bool = False) -> NoReturn:
    """Report ``exc`` (message and hint; JSON error object with ``--json``) and exit."""
    if as_json:
        emit_json({"error": exc.to_dict()})
    else:
        # (a message quotes what it was given — a job id, a path — never to be read as markup)
        stderr = _console("err")
        stderr.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True, highlight=False)
        if exc.hint:
            stderr.print(f"[dim]hint:[/] {escape(exc.hint)}")
    if verbose:
        _console("err").print_exception(show_locals=False)
    raise typer.Exit(exit_code_for(exc))


def cut(text: str, limit: int = SHOWN_CHARS) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters with "…", and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[: limit - 1] + "…", True


def cut_note(what: str, length: int, rerun: str) -> None:
    """Say on stderr that ``what`` (``length`` characters) was cut, and how to see it whole."""
    _console("out").file.flush()  # (so that the two streams, when merged, stay in order)
    _console("err").print(
        f"({what} cut at {SHOWN_CHARS:,} of {length:,} characters; `{rerun}` prints it whole)",
        markup=False,
        highlight=False,
    )


def plain_columns(
    headers: Sequence[str], widths: Sequence[int], rows: Iterable[Sequence[str]]
) -> None:
    """Print ``rows`` under ``headers`` as columns ``widths`` terminal cells wide (a longer
    cell widens its line; the last column is not padded), each line as its row arrives — for
    tables too long for Rich (see :data:`RICH_TABLE_ROWS`). Cells are printed as they are, not
    read as markup, with control characters shown as ``?``."""
    write = sys.stdout.write

    def line(cells: Sequence[str]) -> str:
        shown = [_shown(c) for c in cells]
        padded = [c + " " * (w - _cells(c)) for c, w in zip(shown, widths, strict=False)]
        return "  ".join((*padded[: len(shown) - 1], shown[-1])).rstrip() + "\n"

    write(line(headers))
    write(line(["-" * w for w in widths[: len(headers) - 1]] + ["-" * _cells(headers[-1])]))
    for row in rows:
        write(line(row))
    sys.stdout.flush()


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """:func:`plain_columns` with each column as wide as its widest cell."""
    widths = [_cells(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            width = _cells(_shown(cell))
            if width > widths[i]:
                widths[i] = width
    plain_columns(headers, widths, rows)


def _shown(cell: str) -> str:
    """``cell`` with control characters as ``?`` (most cells have none: checked in C first)."""
    return cell if cell.isprintable() else cell.translate(_CONTROL)


def _cells(text: str) -> int:
    """Terminal cells ``text`` takes (ASCII, also cut with "…": one a character)."""
    if text.isascii() or (text[-1] == "…" and text[:-1].isascii()):
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)
