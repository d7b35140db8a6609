"""Numbered SQL migrations, one folder per backend: ``NNNN_name.sql``.

Versions are unique and increasing but need not be contiguous: a migration is applied when its
version is not yet recorded in the database, whatever the highest recorded version is, so a
migration numbered below one already applied (a branch landed out of order) still runs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

from affidavit.core.errors import MigrationError

VERSION_TABLE = "affidavit_schema_migrations"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql\Z")
# Tokens that matter for splitting a script: quoted strings and dollar-quoted bodies (skipped
# whole), statement ends, and the words that open and close a trigger body.
_TOKEN = re.compile(r"('(?:[^']|'')*'|\$\$|;|\b(?:BEGIN|CASE|END)\b)", re.IGNORECASE)


# The first line of a migration after which a store opened read-only (which never migrates)
# still reads the schema before it: it changes a constraint or an index, or the backend keeps
# the older way of reading (see SqliteStore). Such a migration may be pending in a database
# opened read-only.
OLDER_SCHEMA_READABLE = "-- older schema readable"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def older_schema_readable(self) -> bool:
        """Whether a read-only store reads the schema before this migration (see
        ``OLDER_SCHEMA_READABLE``)."""
        return self.sql.startswith(OLDER_SCHEMA_READABLE + "\n")

    def statements(self) -> list[str]:
        """The script split into statements at top-level ``;``.

        A ``;`` inside a quoted string, a ``$$``-quoted function body (PostgreSQL) or a
        ``BEGIN ... END`` trigger body (SQLite) does not end the statement.
        """
        body = "\n".join(
            line for line in self.sql.splitlines() if not line.lstrip().startswith("--")
        )
        out: list[str] = []
        current: list[str] = []
        depth = 0
        in_dollar = False
        for token in _TOKEN.split(body):
            upper = token.upper()
            if token == "$$":
                in_dollar = not in_dollar
            elif in_dollar or token.startswith("'"):
                pass
            elif upper in ("BEGIN", "CASE"):
                depth += 1
            elif upper == "END":
                depth = max(0, depth - 1)
            elif token == ";" and depth == 0:
                out.append("".join(current).strip())
                current = []
                continue
            current.append(token)
        out.append("".join(current).strip())
        return [s for s in out if s]


def load(backend: str) -> list[Migration]:
    """All migrations for ``backend`` ("sqlite" or "postgres"), in version order."""
    folder = resources.files(__name__).joinpath(backend)
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for previous, m in itertools.pairwise(found):
        if m.version == previous.version:
            raise MigrationError(f"{backend} migrations: version {m.version} is used twice")
    return found


def pending(backend: str, applied: Iterable[int], known: list[Migration]) -> list[Migration]:
    """The migrations of ``known`` not yet in ``applied``, in version order.

    Raises:
        MigrationError: the database records a version this affidavit does not know (it was
            migrated by a newer or a different version).
    """
    done = set(applied)
    versions = {m.version for m in known}
    latest = known[-1].version if known else 0
    unknown = sorted(done - versions)
    if unknown and unknown[-1] > latest:
        raise MigrationError(
            f"the database schema is at version {unknown[-1]}, newer than this affidavit knows "
            f"({latest} for {backend})",
            hint="Upgrade affidavit, or point --db at another database.",
        )
    if unknown:
        raise MigrationError(
            f"the database records migration(s) {unknown} that this affidavit does not know "
            f"({backend})",
            hint="The database was migrated by a different build of affidavit; use that build "
            "or point --db at another database.",
        )
    return [m for m in known if m.version not in done]
