"""``python -m affidavit`` runs the CLI."""

from affidavit.cli.main import main

main()
