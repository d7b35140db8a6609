-- older schema readable
-- Event ids: a unique key only for ids the caller chose. Ids the store makes (32 lowercase hex
-- digits of a UUIDv7, see affidavit.core.ids) are unique by construction, and the store refuses a
-- caller-supplied id of that form; keeping them in an index of their own cost every append one
-- more index entry.
ALTER TABLE events DROP CONSTRAINT events_event_id_key;
-- the same predicate as the SQLite migration's GLOB pattern
CREATE UNIQUE INDEX events_chosen_event_id ON events (event_id)
    WHERE event_id !~ '^[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}$';
