-- API keys. The secret is never stored: only a salted SHA-256 of it (secrets are 256 random
-- bits, so a fast hash is enough; comparison is constant-time). Scopes: admin, inference,
-- read. models: JSON list limiting an inference key, NULL for any model.
CREATE TABLE api_keys (
    key_id      TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    scopes      TEXT NOT NULL,
    models      TEXT,
    salt        BLOB NOT NULL,
    digest      BLOB NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL,
    revoked_at  REAL,
    is_box_key  INTEGER NOT NULL DEFAULT 0
);
