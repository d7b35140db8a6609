"""A forged copy of a SQLite store's file: what anyone with the file could do, for showing that
verification catches it (the demonstration edits a copy, never the store)."""

from __future__ import annotations

import shutil
from pathlib import Path


def forged_copy(db_path: Path, copy_path: Path, job_id: str, version: int, payload: bytes) -> None:
    """Copy the SQLite file at ``db_path`` to ``copy_path`` (every committed event included:
    the write-ahead log is checkpointed first) and overwrite, in the copy only, the stored
    payload bytes of event ``version`` of ``job_id``, leaving its chain hash as it was.

    Raises:
        StoreError: a file cannot be opened.
    """
    from affidavit.store.sqlite import connect_raw

    with connect_raw(db_path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    shutil.copy(db_path, copy_path)
    with connect_raw(copy_path) as raw:
        raw.execute(
            "UPDATE events SET payload = ? WHERE job_id = ? AND version = ?",
            (payload, job_id, version),
        )
