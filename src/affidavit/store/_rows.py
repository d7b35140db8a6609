"""Reading one column of one row of another database, given by URL: what a resource verifier
of ``sql_row`` changes asks (:class:`~affidavit.runtime.SqlRowVerifier`). The database is not
an affidavit store: it is the one the tools change. It is read only (SQLite ``mode=ro``;
PostgreSQL in autocommit, one ``SELECT``), with a connect timeout of 5 s, and the table and
column names are checked identifiers, quoted.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from affidavit.core.errors import ConfigError
from affidavit.store._urls import POSTGRES_PREFIXES, sqlite_path

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?\Z")


def quoted_identifier(name: str, what: str) -> str:
    """``name`` (``column``, ``table`` or ``schema.table``) quoted for SQL.

    Raises:
        ConfigError: it is not letters, digits and ``_`` not starting with a digit.
    """
    if not _IDENTIFIER.match(name):
        raise ConfigError(
            f"invalid {what} {name!r}",
            hint="Use letters, digits and '_' (optionally schema.table), not starting with a "
            "digit.",
        )
    return ".".join(f'"{part}"' for part in name.split("."))


class RowReader:
    """Reads ``column`` of the row of ``table`` whose ``key_column`` is a key, in the database
    at ``url`` (``sqlite:///...`` or ``postgresql://...``; PostgreSQL compares the key as
    text).

    Raises:
        ConfigError: another kind of URL, or a name that is not an identifier.
    """

    def __init__(self, url: str, *, table: str, key_column: str, column: str) -> None:
        self.url = url
        target = quoted_identifier(table, "table name")
        key = quoted_identifier(key_column, "key column")
        value = quoted_identifier(column, "version column")
        self._sqlite_path = sqlite_path(url)
        if self._sqlite_path is not None:
            self._query = f"SELECT {value} FROM {target} WHERE {key} = ?"
        elif url.startswith(POSTGRES_PREFIXES):
            self._query = f"SELECT {value} FROM {target} WHERE {key}::text = %s"
        else:
            raise ConfigError(
                "SqlRowVerifier needs a sqlite:/// or postgresql:// URL",
                hint="The database holding the rows the tools change.",
            )

    def read(self, key: str) -> tuple[bool, Any]:
        """``(whether the row exists, its column's value or None)``; any error of the database
        (unreachable, no such table) is raised as it is."""
        if self._sqlite_path is not None:
            uri = f"file:{Path(self._sqlite_path).resolve()}?mode=ro"
            with sqlite3.connect(uri, uri=True, timeout=5) as conn:
                row = conn.execute(self._query, (key,)).fetchone()
        else:
            import psycopg

            from affidavit.store.postgres import split_url

            conninfo, schema = split_url(self.url)
            with psycopg.connect(conninfo, connect_timeout=5, autocommit=True) as conn:
                if schema:
                    conn.execute(f'SET search_path TO "{schema}"')
                row = conn.execute(self._query, (key,)).fetchone()
        return (row is not None, row[0] if row is not None else None)
