"""The ``affidavit`` console script: ``affidavit --version`` answers before the command-line
application (every command and the layers below them) is imported; everything else runs
:func:`affidavit.cli.main.main`."""

from __future__ import annotations

import sys


def main() -> None:
    """Entry point of the ``affidavit`` script and of ``python -m affidavit``."""
    if sys.argv[1:] == ["--version"]:
        from affidavit import __version__  # (the package root imports its names on use)

        sys.stdout.write(f"affidavit {__version__}\n")
        raise SystemExit(0)
    from affidavit.cli.main import main as run

    run()
