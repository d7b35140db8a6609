-- older schema readable
-- Event keys. (1) A job's log is one range of the events table's rowid: every job gets a
-- number, and an event's seq is (number << 32) + version. The rowid then keeps a log in order
-- and its positions unique, and the (job_id, version) key goes: one B-tree less to write per
-- append. (2) Event ids: a unique key only for ids a caller chose. Ids the store makes (32
-- lowercase hex digits of a UUIDv7, see affidavit.core.ids) are unique by construction, and
-- the store refuses a caller-supplied id of that form. Together they cut a durable tool step's
-- WAL frames from ~12.8 to ~6.7. A store opened read-only reads a database without this
-- migration by its old (job_id, version) key (see SqliteStore).
ALTER TABLE jobs ADD COLUMN number INTEGER;
UPDATE jobs SET number = rowid;
CREATE UNIQUE INDEX jobs_number ON jobs (number);
-- Jobs are never deleted, so the next number is one past the highest.
CREATE TRIGGER jobs_numbered AFTER INSERT ON jobs WHEN NEW.number IS NULL
BEGIN
    UPDATE jobs SET number = (SELECT coalesce(max(number), 0) + 1 FROM jobs)
    WHERE rowid = NEW.rowid;
END;
-- SQLite cannot drop a column's UNIQUE constraint, so the table is rebuilt. An event whose job
-- row is missing (the store never writes one) stops the migration: its job_id comes from jobs,
-- and NULL is refused.
CREATE TABLE events_rebuilt (
    seq         INTEGER PRIMARY KEY,
    job_id      TEXT NOT NULL,
    version     INTEGER NOT NULL,
    event_id    TEXT NOT NULL,
    type        TEXT NOT NULL,
    payload     BLOB NOT NULL,
    chain_hash  TEXT NOT NULL,
    recorded_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
INSERT INTO events_rebuilt (seq, job_id, version, event_id, type, payload, chain_hash, recorded_at)
    SELECT (j.number << 32) + e.version, j.job_id, e.version, e.event_id, e.type, e.payload,
           e.chain_hash, e.recorded_at
    FROM events e LEFT JOIN jobs j ON j.job_id = e.job_id
    ORDER BY 1;
DROP TABLE events;
ALTER TABLE events_rebuilt RENAME TO events;
-- the same predicate as the PostgreSQL migration's regular expression
CREATE UNIQUE INDEX events_chosen_event_id ON events (event_id)
    WHERE event_id NOT GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]7[0-9a-f][0-9a-f][0-9a-f][89ab][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]';
