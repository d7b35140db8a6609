"""A plain connection to a SQLite store's file through the SQLite the store uses (see
:class:`RawConnection`), for tools that read or edit the file directly."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import apsw

from affidavit.store._sqlite_tx import store_error

_DML = ("INSERT", "UPDATE", "DELETE", "REPLACE")


def _is_dml(sql: str) -> bool:
    return sql.lstrip()[:7].upper().startswith(_DML)


class RawCursor:
    """A cursor of :class:`RawConnection` (the DB-API calls tools and tests use)."""

    def __init__(self, raw: RawConnection) -> None:
        self._raw = raw
        self._cur = raw.conn.cursor()
        self._rows: Iterator[Any] = iter(())
        self.rowcount = -1

    def execute(self, sql: str, params: Sequence[Any] = ()) -> RawCursor:
        self._raw._begin_for(sql)
        self._rows = iter(self._cur.execute(sql, params))
        self.rowcount = self._raw.conn.changes() if _is_dml(sql) else -1
        return self

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> RawCursor:
        self._raw._begin_for(sql)
        changed = 0
        for row in rows:
            self._cur.execute(sql, row)
            changed += self._raw.conn.changes()
        self._rows, self.rowcount = iter(()), changed
        return self

    def fetchone(self) -> Any:
        return next(self._rows, None)

    def fetchall(self) -> list[Any]:
        return list(self._rows)

    def __iter__(self) -> Iterator[Any]:
        return self._rows

    def close(self) -> None:
        self._cur.close(True)


class RawConnection:
    """A plain connection to a store's SQLite file, for tools and tests that read or edit the
    file directly (a copy kept as evidence, a tampering test).

    It goes through the SQLite library the store itself uses: two copies of SQLite in one
    process each keep their own account of the file's POSIX locks, and one closing the file
    drops the other's — the other may then find the WAL index gone under it
    (https://sqlite.org/howtocorrupt.html, "Multiple copies of SQLite linked into the same
    application"). Python's ``sqlite3`` module is such another copy: never open a store's file
    with it in a process that has the store open.

    Like ``sqlite3`` by default, an ``INSERT``/``UPDATE``/``DELETE``/``REPLACE`` outside a
    transaction begins one (``autocommit=False``); :meth:`commit` ends it. As a context
    manager it commits (or, on an error, rolls back) and closes."""

    def __init__(self, path: str | Path, *, timeout: float = 5.0, autocommit: bool = False) -> None:
        try:
            self.conn = apsw.Connection(str(path))
        except apsw.Error as exc:
            raise store_error(f"cannot open SQLite database {str(path)!r}", exc) from exc
        self.conn.set_busy_timeout(round(timeout * 1000))
        self.autocommit = autocommit

    def _begin_for(self, sql: str) -> None:
        if not self.autocommit and not self.conn.in_transaction and _is_dml(sql):
            self.conn.execute("BEGIN")

    def cursor(self) -> RawCursor:
        return RawCursor(self)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> RawCursor:
        return RawCursor(self).execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> RawCursor:
        return RawCursor(self).executemany(sql, rows)

    def commit(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self.commit()
            else:
                self.rollback()
        finally:
            self.close()


def connect_raw(
    path: str | Path, *, timeout: float = 5.0, autocommit: bool = False
) -> RawConnection:
    """A :class:`RawConnection` to the SQLite file at ``path``."""
    return RawConnection(path, timeout=timeout, autocommit=autocommit)
