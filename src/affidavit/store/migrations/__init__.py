"""Numbered SQL migrations, one folder per backend: ``NNNN_name.sql``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from affidavit.core.errors import MigrationError

VERSION_TABLE = "affidavit_schema_migrations"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        """The script split into statements (migrations contain no ``;`` inside statements)."""
        body = "\n".join(
            line for line in self.sql.splitlines() if not line.lstrip().startswith("--")
        )
        return [s.strip() for s in body.split(";") if s.strip()]


def load(backend: str) -> list[Migration]:
    """All migrations for ``backend`` ("sqlite" or "postgres"), in version order."""
    folder = resources.files(__name__).joinpath(backend)
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, m in enumerate(found, start=1):
        if m.version != expected:
            raise MigrationError(f"{backend} migrations are not numbered 1..n (found {m.version})")
    return found


def check_not_newer(backend: str, current: int, known: list[Migration]) -> None:
    latest = known[-1].version if known else 0
    if current > latest:
        raise MigrationError(
            f"the database schema is at version {current}, newer than this affidavit knows "
            f"({latest} for {backend})",
            hint="Upgrade affidavit, or point --db at another database.",
        )
