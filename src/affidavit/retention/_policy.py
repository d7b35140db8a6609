"""The retention policy: how long finished jobs stay in the live store, and where their packs
go when they leave it (``affidavit retention set``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from affidavit.core.errors import AffidavitError, ConfigError
from affidavit.store import Store
from affidavit.store.retention import PolicyRow, Rows, policy_read, policy_write

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_AGE = re.compile(r"(\d{1,12})([smhdw])\Z")
MAX_AGE_SECONDS = 100 * 365 * 86_400  # a century: anything longer is a typo


class RetentionError(AffidavitError):
    """Retention cannot run as set: no policy, an archive directory it cannot write, a job that
    may not be held or released."""

    code = "retention_error"
    default_hint = "See `affidavit retention show` and docs/storage.md (Retention)."


def parse_age(text: str) -> int:
    """``90d``, ``12h``, ``30m``, ``45s`` or ``2w`` as seconds.

    Raises:
        ConfigError: another form, or more than a century.
    """
    found = _AGE.match(text.strip())
    if not found:
        raise ConfigError(
            f"{text!r} is not an age", hint="Write a whole number and a unit: 90d, 12h, 30m, 2w."
        )
    seconds = int(found[1]) * _UNITS[found[2]]
    if seconds > MAX_AGE_SECONDS:
        raise ConfigError(f"{text!r} is more than a century", hint="Give a shorter age.")
    return seconds


def format_age(seconds: int) -> str:
    """``seconds`` in the largest unit that divides it (``7776000`` → ``90d``)."""
    for unit, size in sorted(_UNITS.items(), key=lambda u: -u[1]):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Finished jobs older than ``finished_older_than_s`` seconds leave the live store; their
    packs go into ``archive_dir`` (``None``: no pack is kept — ``--no-archive``)."""

    finished_older_than_s: int
    archive_dir: Path | None

    def finished_before(self, now: float) -> str:
        """The cut-off as the store writes times (RFC 3339 UTC with microseconds)."""
        at = datetime.fromtimestamp(now, UTC) - timedelta(seconds=self.finished_older_than_s)
        return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def to_dict(self) -> dict[str, Any]:
        return {
            "finished_older_than": format_age(self.finished_older_than_s),
            "finished_older_than_s": self.finished_older_than_s,
            "archive": None if self.archive_dir is None else str(self.archive_dir),
        }


def policy_of(row: PolicyRow) -> RetentionPolicy | None:
    if row.finished_older_than_s is None:
        return None
    return RetentionPolicy(
        row.finished_older_than_s, None if row.archive_dir is None else Path(row.archive_dir)
    )


def read_policy(store: Store) -> RetentionPolicy | None:
    """The policy set in ``store`` (``None``: none; also on a copy from before migration 25)."""
    if not getattr(store, "retention_tables", True):
        return None
    with store.snapshot() as snap:
        return policy_of(policy_read(cast(Rows, snap)))


def check_archive_dir(path: Path) -> Path:
    """``path`` made absolute, once it is a directory this process may write (created when
    missing).

    Raises:
        RetentionError: it cannot be created or written.
    """
    where = path.expanduser().resolve()
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RetentionError(f"cannot create the archive directory {str(where)!r}: {exc}") from exc
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        raise RetentionError(f"the archive directory {str(where)!r} is not a writable directory")
    return where


def set_policy(
    store: Store, finished_older_than_s: int, archive_dir: Path | None
) -> RetentionPolicy:
    """Set the policy (``archive_dir`` ``None``: removed jobs keep no pack) and return it.

    Raises:
        ConfigError: a negative age.
        RetentionError: the archive directory cannot be written.
    """
    if finished_older_than_s < 0:
        raise ConfigError("the age must not be negative")
    where = None if archive_dir is None else check_archive_dir(archive_dir)
    with store.transaction() as tx:
        policy_write(tx, finished_older_than_s, None if where is None else str(where))
    return RetentionPolicy(finished_older_than_s, where)


def clear_policy(store: Store) -> None:
    """Remove the policy: nothing is removed until one is set again."""
    with store.transaction() as tx:
        policy_write(tx, None, None)
