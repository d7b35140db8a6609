-- older schema readable
-- Seals v2 (see docs/formats.md "Seals"): a seal also signs the Merkle root over its job's
-- events' chain hashes, so that one step can be disclosed with inclusion proofs. Seals made
-- before keep version 1 and no root, and keep verifying. A store opened read-only on a copy made
-- before this migration reads every seal as v1.
ALTER TABLE seals ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE seals ADD COLUMN events_root TEXT;
