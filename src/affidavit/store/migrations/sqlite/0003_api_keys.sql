-- API keys of the HTTP API: only a SHA-256 of the secret is stored; the key is shown once.
CREATE TABLE api_keys (
    key_id     TEXT PRIMARY KEY,
    agent_id   TEXT NOT NULL,
    role       TEXT NOT NULL,
    namespace  TEXT NOT NULL,
    key_hash   TEXT NOT NULL,
    created_at TEXT NOT NULL,
    revoked_at TEXT
);
