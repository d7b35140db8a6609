-- Claims and trust: agents, learning patterns, immutable verification records and a
-- hash-chained trust log per agent (the chain formula of the job event log).
CREATE TABLE agents (
    agent_id               TEXT PRIMARY KEY,
    namespace              TEXT NOT NULL,
    role                   TEXT NOT NULL CHECK (role IN ('observer', 'agent', 'admin')),
    trust_score            DOUBLE PRECISION NOT NULL CHECK (trust_score >= 0 AND trust_score <= 1),
    verifications          BIGINT NOT NULL DEFAULT 0,
    accurate_verifications BIGINT NOT NULL DEFAULT 0,
    error_verifications    BIGINT NOT NULL DEFAULT 0,
    created_at             TEXT NOT NULL,
    updated_at             TEXT NOT NULL
);
CREATE INDEX agents_namespace ON agents (namespace, agent_id);
CREATE TABLE learning_patterns (
    pattern_id     TEXT PRIMARY KEY,
    owner_agent_id TEXT NOT NULL REFERENCES agents (agent_id),
    namespace      TEXT NOT NULL,
    access_level   TEXT NOT NULL
        CHECK (access_level IN ('private', 'team', 'shared', 'public', 'system')),
    name           TEXT NOT NULL,
    success_count  BIGINT NOT NULL DEFAULT 0,
    failure_count  BIGINT NOT NULL DEFAULT 0,
    created_at     TEXT NOT NULL
);
-- One row per verification; evidence holds the canonical JSON document whose SHA-256 is the
-- evidence id. Rows are never changed or deleted (triggers below).
CREATE TABLE claim_verifications (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    verification_id TEXT NOT NULL UNIQUE,
    agent_id        TEXT NOT NULL REFERENCES agents (agent_id),
    claim_type      TEXT NOT NULL,
    verdict         TEXT NOT NULL CHECK (verdict IN ('accurate', 'inaccurate', 'error')),
    decided_by      TEXT NOT NULL,
    verifier_id     TEXT NOT NULL,
    verified_at     TEXT NOT NULL,
    evidence_id     TEXT NOT NULL,
    evidence        BYTEA NOT NULL
);
CREATE INDEX claim_verifications_agent ON claim_verifications (agent_id, claim_type, seq);
CREATE INDEX claim_verifications_agent_seq ON claim_verifications (agent_id, seq);
-- The trust log: per agent, versions 1..n chained like job events.
CREATE TABLE trust_log (
    agent_id    TEXT NOT NULL REFERENCES agents (agent_id),
    version     BIGINT NOT NULL,
    entry_id    TEXT NOT NULL UNIQUE,
    type        TEXT NOT NULL,
    payload     BYTEA NOT NULL,
    chain_hash  TEXT NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, version)
);
-- Evidence and the trust log are append-only: the database refuses UPDATE, DELETE and
-- TRUNCATE, whoever asks.
CREATE FUNCTION claims_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER claim_verifications_immutable BEFORE UPDATE OR DELETE ON claim_verifications
    FOR EACH ROW EXECUTE FUNCTION claims_refuse_change();
CREATE TRIGGER claim_verifications_no_truncate BEFORE TRUNCATE ON claim_verifications
    FOR EACH STATEMENT EXECUTE FUNCTION claims_refuse_change();
CREATE TRIGGER trust_log_immutable BEFORE UPDATE OR DELETE ON trust_log
    FOR EACH ROW EXECUTE FUNCTION claims_refuse_change();
CREATE TRIGGER trust_log_no_truncate BEFORE TRUNCATE ON trust_log
    FOR EACH STATEMENT EXECUTE FUNCTION claims_refuse_change();
