-- older schema readable
-- When each queue grant's hold began by the database's clock, read after the claim took the
-- queue's lock: the clock its end (`ended_at`, migration 21) is read from. `claimed_at` stays
-- the claiming worker's time, the one the limits were counted at; it is read before the lock,
-- so a hold's start by it can precede the end of the hold whose slot it took. NULL for a grant
-- made before this migration.
ALTER TABLE queue_grants ADD COLUMN held_from REAL;
