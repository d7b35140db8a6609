"""The principal the local CLI decides approvals as: ``--as NAME`` is ``operator:NAME``, role
admin (the CLI holds the database; it has no API key). See docs/runtime.md "Approvals"."""

from __future__ import annotations

from typing import Annotated

import typer

from affidavit.core.approvals import Principal, operator

AsOption = Annotated[
    str | None,
    typer.Option(
        "--as",
        help="Decide an approval as operator:NAME (role admin; never the job's submitter).",
        show_default=False,
    ),
]


def principal_of(name: str | None) -> Principal | None:
    """The operator ``--as NAME`` names (``None`` without it: an approval is then refused)."""
    return operator(name) if name is not None else None
