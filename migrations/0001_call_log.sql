-- One row per call, written when the call is accepted and updated as it moves.
-- Stamps are unix seconds (REAL) taken by fitbox; NULL means the step never happened.
CREATE TABLE call_log (
    id                INTEGER PRIMARY KEY,
    request_id        TEXT NOT NULL,
    endpoint          TEXT NOT NULL,
    model_asked       TEXT,
    artifact          TEXT,
    stream            INTEGER NOT NULL DEFAULT 0,
    outcome           TEXT NOT NULL DEFAULT 'pending',  -- pending | ok | error | interrupted
    http_status       INTEGER,
    error_code        TEXT,
    device            TEXT,
    window            INTEGER,
    evicted           TEXT,                             -- JSON list of artifacts evicted for it
    received_at       REAL NOT NULL,
    admitted_at       REAL,
    load_start_at     REAL,
    load_ready_at     REAL,
    first_byte_at     REAL,
    last_byte_at      REAL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER
);
CREATE INDEX call_log_outcome ON call_log (outcome);
