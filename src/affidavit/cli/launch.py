"""The ``affidavit`` console script: ``affidavit --version`` answers before the command-line
application (every command and the layers below them) is imported; everything else runs
:func:`affidavit.cli.main.main`."""

from __future__ import annotations

import gc
import sys


def main() -> None:
    """Entry point of the ``affidavit`` script and of ``python -m affidavit``."""
    if sys.argv[1:] == ["--version"]:
        from affidavit import __version__  # (the package root imports its names on use)

        sys.stdout.write(f"affidavit {__version__}\n")
        raise SystemExit(0)
    from affidavit.cli.main import main as run

    try:
        run()
    finally:
        # The command is done and the process ends: its objects (tens of thousands, most of
        # them the modules' own) are moved out of the collector's reach, so the interpreter's
        # shutdown does not walk them all once more — ~50 ms of a worker's or a CLI command's
        # exit. Files and connections are closed by the commands themselves; atexit handlers
        # (an OpenTelemetry exporter's flush) and the flush of stdout and stderr run as before.
        gc.freeze()
