"""Storage: one :class:`Store` protocol, two backends chosen by URL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from affidavit.core.errors import ConfigError, UnsupportedDatabaseURL
from affidavit.store._forgery import forged_copy
from affidavit.store._rows import RowReader
from affidavit.store._sealkeys import SealKeyAdmission
from affidavit.store._subjects import SubjectKeys, SubjectRow
from affidavit.store._tlog import LogLeaf, QueuedLeaf, RejectedLeaf
from affidavit.store._trust import ClaimOutcome, trust_record_id
from affidavit.store._urls import SUPPORTED_SCHEMES, database_file, sqlite_path, url_backend
from affidavit.store.base import (
    JOB_STATUSES,
    TERMINAL_STATUSES,
    ApiKeyRow,
    CancelRequest,
    Claimed,
    ClockOffset,
    Encoded,
    JobFilter,
    JobRecord,
    LedgerColumns,
    LedgerRow,
    NewEvent,
    NewJob,
    NextClaim,
    Snapshot,
    Store,
    StoredEvent,
    Transaction,
    unmatchable,
)

if TYPE_CHECKING:
    from affidavit.store.sqlite import RawConnection


__all__ = [
    "JOB_STATUSES",
    "SUPPORTED_SCHEMES",
    "TERMINAL_STATUSES",
    "ApiKeyRow",
    "CancelRequest",
    "ClaimOutcome",
    "Claimed",
    "ClockOffset",
    "Encoded",
    "JobFilter",
    "JobRecord",
    "LedgerColumns",
    "LedgerRow",
    "LogLeaf",
    "NewEvent",
    "NewJob",
    "NextClaim",
    "QueuedLeaf",
    "RejectedLeaf",
    "RowReader",
    "SealKeyAdmission",
    "Snapshot",
    "Store",
    "StoredEvent",
    "SubjectKeys",
    "SubjectRow",
    "Transaction",
    "connect_raw",
    "database_file",
    "forged_copy",
    "open_store",
    "postgres_conninfo",
    "sqlite_path",
    "trust_record_id",
    "unmatchable",
    "url_backend",
]


def open_store(
    url: str, *, migrate: bool = True, read_only: bool = False, connections: int = 1
) -> Store:
    """Open the database at ``url`` and (by default) apply pending migrations.

    ``connections``: how many connections a PostgreSQL store opens before it returns (more
    are opened when needed, up to the URL's ``pool_size``): a worker running N jobs at once
    opens N + 2 so that none of its first jobs waits for one. SQLite ignores it.

    ``read_only``: change nothing — no database is created, no migration applied, and every
    write fails (SQLite connections with ``mode=ro``; PostgreSQL sessions with
    ``default_transaction_read_only``), so a read-only file or mount, or a role with only
    SELECT rights, is enough. The schema must then already be this affidavit's
    (:class:`MigrationError` otherwise).

    ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``,
    ``postgresql://user[:password]@host[:port]/dbname[?schema=NAME]``.

    Raises:
        UnsupportedDatabaseURL: any other scheme.
        ConfigError: ``connections`` is below 1.
        StoreError: the database cannot be opened or reached.
    """
    if connections < 1:
        raise ConfigError(
            f"connections must be at least 1, not {connections}",
            hint="Give how many connections to open at once (a worker: its jobs at once + 2).",
        )
    path = sqlite_path(url)
    if path is not None:
        if not path or path == ":memory:":
            raise UnsupportedDatabaseURL(
                f"{url!r} names no file",
                hint="Give a file path: sqlite:///./affidavit.db (several connections must "
                "share the database, so :memory: is not supported).",
            )
        from affidavit.store.sqlite import SqliteStore

        return SqliteStore(url, path, migrate=migrate, read_only=read_only)
    url_backend(url)  # (raises for an unsupported scheme)
    from affidavit.store.postgres import PostgresStore

    return PostgresStore(url, migrate=migrate, read_only=read_only, min_size=connections)


def postgres_conninfo(url: str) -> tuple[str, str | None]:
    """A ``postgresql://`` URL as libpq takes it, and the schema its ``schema=NAME`` parameter
    names (``None`` without one): the URL without the parameters only affidavit reads
    (``schema``, ``pool_size``, ``pool_timeout``), for code that connects to the same database
    on its own.

    Raises:
        ConfigError: the schema name is not a valid identifier.
    """
    from affidavit.store.postgres import split_url

    return split_url(url)


def connect_raw(
    path: str | Path, *, timeout: float = 5.0, autocommit: bool = False
) -> RawConnection:
    """A plain connection to a SQLite store's file, for tools that read or edit the file
    directly (a copy kept as evidence, a tampering demonstration). It goes through the SQLite
    library the store uses, so it is safe in a process that has the store open (Python's
    ``sqlite3`` is another copy of SQLite and is not: see
    :class:`~affidavit.store.sqlite.RawConnection`).

    Raises:
        StoreError: the file cannot be opened.
    """
    from affidavit.store.sqlite import connect_raw as connect

    return connect(path, timeout=timeout, autocommit=autocommit)
