-- older schema readable
-- The transparency log of seals: one store-wide RFC 6962 Merkle tree (see docs/transparency.md).
-- A seal's leaf is queued in the transaction that writes the seal, then integrated by the
-- sequencer (one at a time, by the lease in tlog_state) in batches.
CREATE TABLE tlog_queue (
    seq       BIGSERIAL PRIMARY KEY,
    job_id    TEXT NOT NULL,
    leaf      BYTEA NOT NULL,
    queued_at DOUBLE PRECISION NOT NULL
);
-- Integrated leaves, by index in the tree.
CREATE TABLE tlog_leaves (
    idx           BIGINT PRIMARY KEY,
    job_id        TEXT NOT NULL,
    leaf          BYTEA NOT NULL,
    queued_at     DOUBLE PRECISION NOT NULL,
    integrated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX tlog_leaves_job ON tlog_leaves (job_id);
-- Every complete (perfect) subtree: id = (level << 48) | index. Immutable once written.
CREATE TABLE tlog_nodes (
    id   BIGINT PRIMARY KEY,
    hash BYTEA NOT NULL
);
-- Signed checkpoints, one per tree size the sequencer reached.
CREATE TABLE tlog_checkpoints (
    size       BIGINT PRIMARY KEY,
    note       TEXT NOT NULL,
    created_at TEXT NOT NULL
);
-- Witness cosignature lines for a checkpoint (one per witness key).
CREATE TABLE tlog_cosignatures (
    size      BIGINT NOT NULL,
    name      TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    line      TEXT NOT NULL,
    added_at  TEXT NOT NULL,
    PRIMARY KEY (size, name, key_id)
);
-- The log's head and the sequencer's lease (one row).
CREATE TABLE tlog_state (
    id          BIGINT PRIMARY KEY CHECK (id = 1),
    origin      TEXT,
    size        BIGINT NOT NULL,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION
);
INSERT INTO tlog_state (id, origin, size) VALUES (1, NULL, 0);
