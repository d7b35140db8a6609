-- reads unchanged
-- Event ids: a unique key only for ids the caller chose. Ids the store makes (32 lowercase hex
-- digits of a UUIDv7, see affidavit.core.ids) are unique by construction, and the store refuses a
-- caller-supplied id of that form; keeping them in a B-tree of their own cost every append one
-- more page per transaction. SQLite cannot drop the column's UNIQUE constraint, so the table is
-- rebuilt with its rows (and their seq) as they are.
CREATE TABLE events_rebuilt (
    seq         INTEGER PRIMARY KEY,
    job_id      TEXT NOT NULL,
    version     INTEGER NOT NULL,
    event_id    TEXT NOT NULL,
    type        TEXT NOT NULL,
    payload     BLOB NOT NULL,
    chain_hash  TEXT NOT NULL,
    recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (job_id, version)
);
INSERT INTO events_rebuilt (seq, job_id, version, event_id, type, payload, chain_hash, recorded_at)
    SELECT seq, job_id, version, event_id, type, payload, chain_hash, recorded_at FROM events;
DROP TABLE events;
ALTER TABLE events_rebuilt RENAME TO events;
-- the same predicate as the PostgreSQL migration's regular expression
CREATE UNIQUE INDEX events_chosen_event_id ON events (event_id)
    WHERE event_id NOT GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]7[0-9a-f][0-9a-f][0-9a-f][89ab][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]';
