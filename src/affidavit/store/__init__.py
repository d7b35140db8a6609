"""Storage: one :class:`Store` protocol, two backends chosen by URL."""

from __future__ import annotations

from affidavit.core.errors import UnsupportedDatabaseURL
from affidavit.store.base import (
    JOB_STATUSES,
    TERMINAL_STATUSES,
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
    "JobFilter",
    "JobRecord",
    "NewEvent",
    "Snapshot",
    "Store",
    "StoredEvent",
    "Transaction",
    "open_store",
]


def open_store(url: str, *, migrate: bool = True) -> Store:
    """Open the database at ``url`` and (by default) apply pending migrations.

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

        return SqliteStore(url, path, migrate=migrate)
    if url.startswith(("postgresql://", "postgres://")):
        from affidavit.store.postgres import PostgresStore

        return PostgresStore(url, migrate=migrate)
    shown = url.split("://", 1)[0] + "://…" if "://" in url else repr(url)
    raise UnsupportedDatabaseURL(
        f"unsupported database URL {shown}; supported: {', '.join(SUPPORTED_SCHEMES)}"
    )
