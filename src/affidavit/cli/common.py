"""Options and plumbing every command shares."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

import typer

from affidavit.cli import output
from affidavit.core.config import DATABASE_URL_ENV, database_url
from affidavit.core.errors import AffidavitError, MigrationError, NoSchemaError
from affidavit.store import Store, open_store


@dataclass
class _State:
    verbose: bool = False
    max_input_bytes: int | None = None  # --max-input-bytes (else the environment's, or 64 MiB)


state = _State()

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"Database URL (sqlite:///path.db or postgresql://...). "
        f"Default: ${DATABASE_URL_ENV}, else sqlite:///./affidavit.db.",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
# (pack verify, disclose verify: the witnesses a transparency-log proof must carry)
WitnessKeysOption = Annotated[
    list[str] | None,
    typer.Option(
        "--witness-key",
        help="With --log-key: a witness's cosigner vkey that must have cosigned the "
        "proof's checkpoint; repeatable.",
        show_default=False,
    ),
]


@contextmanager
def command(as_json: bool) -> Iterator[None]:
    """Run a command body: an :class:`AffidavitError` becomes message, hint and exit code."""
    try:
        yield
    except AffidavitError as exc:
        output.fail(exc, as_json=as_json, verbose=state.verbose)


@contextmanager
def opened(db: str | None, *, read_only: bool = False) -> Iterator[Store]:
    """The store named by ``--db`` (or the environment), closed afterwards. ``read_only`` for
    commands that only read: nothing is created or migrated, and read access is enough."""
    store = open_store(database_url(db), read_only=read_only)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def opened_for_job(db: str | None, job_id: str) -> Iterator[Store]:
    """The store for a decision on ``job_id`` (signal, resume, cancel). The job is looked up
    read-only first, so that an unknown job or a mistyped ``--db`` creates nothing — no
    database file, schema or signing key. (A database whose schema is behind skips that
    look-up; opening it for writing migrates it, as every writing command does.)"""
    try:
        with opened(db, read_only=True) as reader:
            reader.get_job(job_id)
    except NoSchemaError:
        raise
    except MigrationError:
        pass
    with opened(db) as store:
        yield store
