"""Settings read from the environment, with their defaults in one place."""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "sqlite:///./affidavit.db"
DATABASE_URL_ENV = "AFFIDAVIT_DATABASE_URL"
DEFAULT_NAMESPACE = "default"


def database_url(explicit: str | None = None) -> str:
    """The database URL: ``explicit`` if given, else ``$AFFIDAVIT_DATABASE_URL``, else the
    embedded SQLite file ``./affidavit.db``. An empty ``explicit`` (``--db ""``: a variable a
    script left unset) is returned as it is, for :func:`open_store` to refuse, rather than
    sending the work to the default database."""
    if explicit is not None:
        return explicit
    return os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE_URL
