"""Settings read from the environment, with their defaults in one place."""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "sqlite:///./affidavit.db"
DATABASE_URL_ENV = "AFFIDAVIT_DATABASE_URL"
DEFAULT_NAMESPACE = "default"
# How long a worker's claim on a job lasts without a heartbeat.
DEFAULT_LEASE_SECONDS = 15.0
# How long a run keeps trying a write while the database is unavailable (a restart, a
# failover, a lock held past the busy timeout), and the waits between tries.
DEFAULT_STORE_RETRY_SECONDS = 60.0
# Recoveries in a row without progress after which a job is parked (reason crash_loop)
# instead of being run again: a step that kills its worker (out of memory, sys.exit, a crash in
# native code) would otherwise take down every worker that picks the job up, for ever.
DEFAULT_MAX_RECOVERIES = 5


def database_url(explicit: str | None = None) -> str:
    """The database URL: ``explicit`` if given, else ``$AFFIDAVIT_DATABASE_URL``, else the
    embedded SQLite file ``./affidavit.db``. An empty ``explicit`` (``--db ""``: a variable a
    script left unset) is returned as it is, for :func:`open_store` to refuse, rather than
    sending the work to the default database."""
    if explicit is not None:
        return explicit
    return os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL


MAX_INPUT_BYTES_ENV = "AFFIDAVIT_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 64 * 1024 * 1024  # 64 MiB


def max_input_bytes(explicit: int | None = None) -> int:
    """The most bytes affidavit reads from one file a user names (a plan, ``--input @file``,
    ``--claim @file``, ...): ``explicit`` if given, else ``$AFFIDAVIT_MAX_INPUT_BYTES``, else
    64 MiB.

    Raises:
        ConfigError: the variable is not a positive whole number.
    """
    from affidavit.core.errors import ConfigError

    if explicit is not None:
        return explicit
    text = os.environ.get(MAX_INPUT_BYTES_ENV)
    if not text:
        return DEFAULT_MAX_INPUT_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{MAX_INPUT_BYTES_ENV}={text!r} is not a positive whole number")
    return value


PACK_MAX_FILE_BYTES_ENV = "AFFIDAVIT_PACK_MAX_FILE_BYTES"
DEFAULT_PACK_MAX_FILE_BYTES = 256 * 1024 * 1024  # 256 MiB


def pack_max_file_bytes(explicit: int | None = None) -> int:
    """The most bytes one file of a proof pack may hold when a pack is verified (larger files
    fail its integrity, refused by their size before they are read): ``explicit`` if given,
    else ``$AFFIDAVIT_PACK_MAX_FILE_BYTES``, else 256 MiB.

    Raises:
        ConfigError: ``explicit`` or the variable is not a positive whole number.
    """
    from affidavit.core.errors import ConfigError

    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 1:
            raise ConfigError(f"max_file_bytes must be a positive whole number, not {explicit!r}")
        return explicit
    text = os.environ.get(PACK_MAX_FILE_BYTES_ENV)
    if not text:
        return DEFAULT_PACK_MAX_FILE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{PACK_MAX_FILE_BYTES_ENV}={text!r} is not a positive whole number")
    return value
