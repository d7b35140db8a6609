"""The durable index of job ids an auditor (witness or monitor) has seen in a log.

One SQLite file (``jobs.sqlite`` in the auditor's state directory) of rows ``SHA-256(job_id)
→ leaf index`` (a ``WITHOUT ROWID`` table: about 45 bytes a job), and the tree size it covers.
An audit adds the new entries' keys to a temporary table inside one transaction; only
:meth:`JobIndex.commit` moves them into the index, with the new size, atomically
(``synchronous=FULL``): a crash at any point leaves the index as it was before that audit or
after it, never in between. The caller commits only after its own state (the checkpoint it
cosigned or verified) is durable, so the index never covers more than that state; if it lags
behind (a crash between the two), the next audit reads the missing entries again.

It is the auditor's own local file, not a store of a runtime's record, but its SQL lives with
the rest of the project's SQL: the transparency-log auditors (:mod:`affidavit.tlog`) use it
through :class:`JobIndex` and never write a statement themselves.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from affidavit.core.errors import AffidavitError

INDEX_FILE = "jobs.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (key BLOB PRIMARY KEY, leaf INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    origin TEXT NOT NULL,
    size INTEGER NOT NULL
);
"""


class AuditStateError(AffidavitError):
    """The auditor's job-id index is unreadable (not written by a crash: SQLite's commits are
    atomic — by something else)."""

    code = "audit_state_unreadable"
    default_hint = (
        "Move the state directory's jobs.sqlite aside: the next run rebuilds it from leaf 0."
    )


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _guarded(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """A SQLite error (a locked file: another process on the same state directory; a full
    disk) as an :class:`AuditStateError`; SQLite's transaction leaves the index as it was."""

    @functools.wraps(method)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(*args, **kwargs)
        except sqlite3.Error as exc:
            raise AuditStateError(
                f"the job-id index cannot be updated: {exc}",
                hint="Is another witness or monitor using this state directory?",
            ) from exc

    return run


def job_key(job_id: str) -> bytes:
    return hashlib.sha256(job_id.encode("utf-8")).digest()


class JobIndex:
    """The index in ``path`` for the log named ``origin`` (an index of another log is reset)."""

    def __init__(self, path: Path, origin: str) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.execute("PRAGMA temp_store = FILE")
            self._db.executescript(_SCHEMA)
            self._db.execute(
                "CREATE TEMP TABLE IF NOT EXISTS batch "
                "(key BLOB PRIMARY KEY, leaf INTEGER NOT NULL) WITHOUT ROWID"
            )
            row = self._db.execute("SELECT origin, size FROM meta WHERE id = 1").fetchone()
            if row is None or row[0] != origin:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("DELETE FROM jobs")
                self._db.execute("INSERT OR REPLACE INTO meta VALUES (1, ?, 0)", (origin,))
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise AuditStateError(f"the job-id index {str(path)!r} is unusable: {exc}") from exc

    @property
    def size(self) -> int:
        """The tree size the index covers: leaves ``[0, size)`` are in it."""
        row = self._db.execute("SELECT size FROM meta WHERE id = 1").fetchone()
        return int(row[0])

    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM jobs").fetchone()[0])

    @_guarded
    def begin(self) -> None:
        """Start an audit's batch (an earlier unfinished one is dropped)."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("DELETE FROM temp.batch")

    @_guarded
    def add(self, key: bytes, leaf: int) -> int | None:
        """Record that leaf ``leaf`` names the job with ``key``; the index of an earlier leaf
        naming it (in the index or earlier in the batch), else ``None``."""
        row = self._db.execute("SELECT leaf FROM jobs WHERE key = ?", (key,)).fetchone()
        if row is not None:
            return int(row[0])
        cur = self._db.execute("INSERT OR IGNORE INTO temp.batch VALUES (?, ?)", (key, leaf))
        if cur.rowcount == 1:
            return None
        row = self._db.execute("SELECT leaf FROM temp.batch WHERE key = ?", (key,)).fetchone()
        return int(row[0])

    @_guarded
    def commit(self, size: int) -> None:
        """Move the batch into the index, which then covers ``[0, size)``; one atomic, durable
        commit."""
        self._db.execute("INSERT INTO jobs SELECT key, leaf FROM temp.batch")
        self._db.execute("UPDATE meta SET size = ? WHERE id = 1", (size,))
        self._db.execute("COMMIT")
        self._db.execute("DELETE FROM temp.batch")

    def abort(self) -> None:
        """Drop the batch; the index is as it was."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    @_guarded
    def reset(self) -> None:
        """Forget everything (the state it covered is gone): the next audit starts at leaf 0."""
        self.abort()
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("DELETE FROM jobs")
        self._db.execute("UPDATE meta SET size = 0 WHERE id = 1")
        self._db.execute("COMMIT")

    def close(self) -> None:
        self.abort()
        self._db.close()
