"""A database as the release before migration 6 left it: its schema (migration 5) and its data.

Made from a current database by undoing migration 6 in SQL, so that the data in it is what the
runtime really writes; the tests then check what this version does with such a database
(upgrade it, or read it read-only).
"""

from __future__ import annotations

from tests.verify.helpers import RawDb

_SQLITE = [
    "DROP TRIGGER jobs_numbered",
    "DROP INDEX jobs_number",
    "ALTER TABLE jobs DROP COLUMN number",
    # migration 1's table, rows in their order
    """CREATE TABLE events_v5 (
        seq         INTEGER PRIMARY KEY,
        job_id      TEXT NOT NULL,
        version     INTEGER NOT NULL,
        event_id    TEXT NOT NULL UNIQUE,
        type        TEXT NOT NULL,
        payload     BLOB NOT NULL,
        chain_hash  TEXT NOT NULL,
        recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
        UNIQUE (job_id, version)
    )""",
    "INSERT INTO events_v5 (job_id, version, event_id, type, payload, chain_hash, recorded_at) "
    "SELECT job_id, version, event_id, type, payload, chain_hash, recorded_at FROM events "
    "ORDER BY seq",
    "DROP TABLE events",
    "ALTER TABLE events_v5 RENAME TO events",
]
_POSTGRES = [
    "DROP INDEX events_chosen_event_id",
    "ALTER TABLE events ADD CONSTRAINT events_event_id_key UNIQUE (event_id)",
]


def undo_migration_6(url: str) -> None:
    """Turn the database at ``url`` (closed by every store) back into a version-5 one."""
    raw = RawDb(url)
    for statement in _SQLITE if url.startswith("sqlite:///") else _POSTGRES:
        raw.execute(statement)
    raw.execute("DELETE FROM affidavit_schema_migrations WHERE version = 6")
