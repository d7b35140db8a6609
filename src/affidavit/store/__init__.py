"""Storage: one :class:`Store` protocol, two backends chosen by URL."""

from __future__ import annotations

from affidavit.core.errors import UnsupportedDatabaseURL
from affidavit.store.base import (
    JOB_STATUSES,
    TERMINAL_STATUSES,
    ClockOffset,
    JobFilter,
    JobRecord,
    NewEvent,
    Snapshot,
    Store,
    StoredEvent,
    Transaction,
)

SUPPORTED_SCHEMES = ("sqlite:///", "postgresql://", "postgres://")

__all__ = [
    "JOB_STATUSES",
    "SUPPORTED_SCHEMES",
    "TERMINAL_STATUSES",
    "ClockOffset",
    "JobFilter",
    "JobRecord",
    "NewEvent",
    "Snapshot",
    "Store",
    "StoredEvent",
    "Transaction",
    "open_store",
]


def open_store(url: str, *, migrate: bool = True, read_only: bool = False) -> Store:
    """Open the database at ``url`` and (by default) apply pending migrations.

    ``read_only``: change nothing — no database is created, no migration applied, and every
    write fails (SQLite connections with ``mode=ro``; PostgreSQL sessions with
    ``default_transaction_read_only``), so a read-only file or mount, or a role with only
    SELECT rights, is enough. The schema must then already be this affidavit's
    (:class:`MigrationError` otherwise).

    ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``,
    ``postgresql://user[:password]@host[:port]/dbname[?schema=NAME]``.

    Raises:
        UnsupportedDatabaseURL: any other scheme.
        StoreError: the database cannot be opened or reached.
    """
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :].split("?", 1)[0]
        if not path or path == ":memory:":
            raise UnsupportedDatabaseURL(
                f"{url!r} names no file",
                hint="Give a file path: sqlite:///./affidavit.db (several connections must "
                "share the database, so :memory: is not supported).",
            )
        from affidavit.store.sqlite import SqliteStore

        return SqliteStore(url, path, migrate=migrate, read_only=read_only)
    if url.startswith(("postgresql://", "postgres://")):
        from affidavit.store.postgres import PostgresStore

        return PostgresStore(url, migrate=migrate, read_only=read_only)
    shown = url.split("://", 1)[0] + "://…" if "://" in url else repr(url)
    raise UnsupportedDatabaseURL(
        f"unsupported database URL {shown}; supported: {', '.join(SUPPORTED_SCHEMES)}"
    )
