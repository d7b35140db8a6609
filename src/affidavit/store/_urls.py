"""What a database URL means, answered by the store: which backend it names and, for SQLite,
which file — for code that must know without opening the store (opening a SQLite store creates
a missing file)."""

from __future__ import annotations

from pathlib import Path

from affidavit.core.errors import UnsupportedDatabaseURL

SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")
SUPPORTED_SCHEMES = (SQLITE_PREFIX, *POSTGRES_PREFIXES)


def sqlite_path(url: str) -> str | None:
    """The file path a ``sqlite:///`` URL names, as written (relative or absolute, without the
    URL's parameters; empty when it names none); ``None`` for a URL of another backend."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    return url[len(SQLITE_PREFIX) :].split("?", 1)[0]


def database_file(url: str) -> Path | None:
    """The resolved file of a SQLite database URL, or ``None`` when the URL names no local file
    (another backend, or no path or ``:memory:``)."""
    path = sqlite_path(url)
    if not path or path == ":memory:":
        return None
    return Path(path).expanduser().resolve()


def url_backend(url: str) -> str:
    """The backend a URL names: ``"sqlite"`` or ``"postgresql"`` (what
    :attr:`~affidavit.store.base.Store.backend` of the store it opens says).

    Raises:
        UnsupportedDatabaseURL: any other scheme.
    """
    if url.startswith(SQLITE_PREFIX):
        return "sqlite"
    if url.startswith(POSTGRES_PREFIXES):
        return "postgresql"
    shown = url.split("://", 1)[0] + "://…" if "://" in url else repr(url)
    raise UnsupportedDatabaseURL(
        f"unsupported database URL {shown}; supported: {', '.join(SUPPORTED_SCHEMES)}"
    )
