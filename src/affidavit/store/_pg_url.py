"""What a ``postgresql://`` URL says to the PostgreSQL backend (its own parameters: schema,
pool size and timeout, prepared statements), and how a driver error becomes the store's."""

from __future__ import annotations

import math
import re
from urllib.parse import parse_qsl, quote, urlencode

import psycopg
from psycopg_pool import PoolClosed

from affidavit.core.errors import (
    ConfigError,
    StoreError,
    StoreUnavailable,
)
from affidavit.store._sql_rows import (
    FULL_DISK_HINT,
)

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_DIGITS = re.compile(r"[0-9]{1,6}")
_DISK_FULL = "53100"  # SQLSTATE disk_full: "could not extend file ... No space left on device"
# The URL parameters that are ours, not libpq's: removed before the URL reaches libpq.
OWN_PARAMETERS = ("schema", "pool_size", "pool_timeout", "prepare")
DEFAULT_POOL_SIZE = 10
MAX_POOL_SIZE = 1000
# How long an operation waits for a connection of the pool, in seconds: while the server is
# away no connection comes, and each try of a write or a claim waits this long before it fails
# as unavailable (and is tried again); a connection is otherwise held for one transaction.
DEFAULT_POOL_TIMEOUT = 10.0


def split_url(url: str) -> tuple[str, str | None]:
    """Return (libpq conninfo URL, schema) after removing our parameters (``schema``,
    ``pool_size``, ``pool_timeout``, ``prepare``)."""
    base, _, query = url.partition("?")
    params = parse_qsl(query, keep_blank_values=True)
    schema = None
    rest = []
    for key, value in params:
        if key == "schema":
            schema = value
        elif key not in OWN_PARAMETERS:
            rest.append((key, value))
    if schema is not None and not _SCHEMA_NAME.match(schema):
        raise ConfigError(
            f"invalid schema name {schema!r} in the database URL",
            hint="A schema name is letters, digits and '_', not starting with a digit.",
        )
    # (re-encoded as libpq decodes: %20 for a space, never "+", which libpq keeps as it is)
    return (base + ("?" + urlencode(rest, quote_via=quote) if rest else "")), schema


def _url_values(url: str, name: str) -> list[str]:
    """Every value the URL's query gives parameter ``name``, in order."""
    return [v for k, v in parse_qsl(url.partition("?")[2], keep_blank_values=True) if k == name]


def pool_size_of(url: str) -> int:
    """The most connections a store opened on ``url`` holds: the URL's ``pool_size``
    (1 to 1,000), else 10.

    Raises:
        ConfigError: ``pool_size`` is given but is not such a number (or is given twice).
    """
    values = _url_values(url, "pool_size")
    if not values:
        return DEFAULT_POOL_SIZE
    text = values[-1]
    if len(values) > 1 or not _DIGITS.fullmatch(text) or not 1 <= int(text) <= MAX_POOL_SIZE:
        shown = ", ".join(repr(v) for v in values)
        raise ConfigError(
            f"invalid pool_size {shown} in the database URL",
            hint=f"Give pool_size once, as a whole number from 1 to {MAX_POOL_SIZE:,} "
            f"(connections; the default is {DEFAULT_POOL_SIZE}).",
        )
    return int(text)


def pool_timeout_of(url: str) -> float:
    """How long an operation of a store opened on ``url`` waits for a pooled connection: the
    URL's ``pool_timeout`` (seconds, a positive finite number), else 10.

    Raises:
        ConfigError: ``pool_timeout`` is given but is not such a number (or is given twice).
    """
    values = _url_values(url, "pool_timeout")
    if not values:
        return DEFAULT_POOL_TIMEOUT
    try:
        seconds = float(values[-1]) if len(values) == 1 else math.nan
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        shown = ", ".join(repr(v) for v in values)
        raise ConfigError(
            f"invalid pool_timeout {shown} in the database URL",
            hint="Give pool_timeout once, as a positive number of seconds (how long an "
            f"operation waits for a connection; the default is {DEFAULT_POOL_TIMEOUT:g}).",
        )
    return seconds


def prepare_of(url: str) -> bool:
    """Whether a store opened on ``url`` prepares its hot statements on the server (see
    :meth:`PostgresTransaction._executed`): the URL's ``prepare`` (``on`` or ``off``), else
    on. Off is for a connection pooler in transaction mode, which may give each transaction
    another server session than the one that prepared a statement.

    Raises:
        ConfigError: ``prepare`` is given but is neither ``on`` nor ``off`` (or is given twice).
    """
    values = _url_values(url, "prepare")
    if not values:
        return True
    if len(values) > 1 or values[0] not in ("on", "off"):
        shown = ", ".join(repr(v) for v in values)
        raise ConfigError(
            f"invalid prepare {shown} in the database URL",
            hint="Give prepare once, as on (the default) or off (behind a connection pooler "
            "in transaction mode).",
        )
    return values[0] == "on"


def store_error(message: str, exc: psycopg.Error) -> StoreError:
    """``exc`` as a :class:`StoreError`; a :class:`StoreUnavailable` when it may pass: a lost
    or refused connection, a server shutting down, a serialization failure or deadlock
    (psycopg's ``OperationalError`` and its subclasses) — but not this store being closed
    (``PoolClosed``), which no wait undoes."""
    transient = isinstance(exc, psycopg.OperationalError) and not isinstance(exc, PoolClosed)
    if getattr(exc, "sqlstate", None) == _DISK_FULL:
        return StoreUnavailable(f"{message}: {exc}", hint=FULL_DISK_HINT)
    return (StoreUnavailable if transient else StoreError)(f"{message}: {exc}")


# What a server says when it refuses a session for now (libpq gives no SQLSTATE for a failed
# connection, only the server's FATAL message): starting up, shutting down, in recovery, out of
# connection slots, a database closed to connections for the moment.
_TRANSIENT_FATAL = (
    "starting up",
    "shutting down",
    "recovery mode",
    "not yet accepting connections",
    "too many clients",
    "connection slots are reserved",
    "not currently accepting connections",
    "terminating connection",
)


def connect_may_pass(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt may succeed when tried again: the server was not
    reachable at all (refused, no route, timed out, closed the connection), or answered that
    it cannot take a session now. A refused login or a missing database or role (any other
    ``FATAL``) will not pass by waiting."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    text = str(exc)
    if "FATAL:" not in text:
        return True
    fatal = text.split("FATAL:", 1)[1]
    return any(marker in fatal for marker in _TRANSIENT_FATAL)


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``, for messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)
