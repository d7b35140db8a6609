"""``python -m affidavit`` runs the CLI."""

from affidavit.cli.launch import main

main()
