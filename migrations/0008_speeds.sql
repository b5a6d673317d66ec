-- What each call ran on (rung, cache types, bytes per device, split, cores) and what the
-- engine measured (llama-server's `timings`); and measured speeds as facts the core reads.
ALTER TABLE call_log ADD COLUMN rung TEXT;
ALTER TABLE call_log ADD COLUMN type_k TEXT;
ALTER TABLE call_log ADD COLUMN type_v TEXT;
ALTER TABLE call_log ADD COLUMN devices TEXT;        -- JSON {device: bytes}
ALTER TABLE call_log ADD COLUMN tensor_split TEXT;   -- JSON [share, ...]
ALTER TABLE call_log ADD COLUMN cores TEXT;          -- JSON [physical core, ...]
ALTER TABLE call_log ADD COLUMN cache_tokens INTEGER;
ALTER TABLE call_log ADD COLUMN prompt_ms REAL;
ALTER TABLE call_log ADD COLUMN prompt_per_token_ms REAL;
ALTER TABLE call_log ADD COLUMN decode_ms REAL;
ALTER TABLE call_log ADD COLUMN decode_per_token_ms REAL;

CREATE TABLE measured_speeds (
    id                   INTEGER PRIMARY KEY,
    artifact             TEXT NOT NULL,
    artifact_size        INTEGER NOT NULL,
    artifact_mtime_ns    INTEGER NOT NULL,
    rung                 TEXT NOT NULL,
    placement            TEXT NOT NULL,     -- the placement class (core/decide.py)
    prompt_tokens        INTEGER,
    prompt_per_token_ms  REAL,
    decode_tokens        INTEGER,
    decode_per_token_ms  REAL,
    call_id              INTEGER,           -- the call that measured it
    measured_at          REAL NOT NULL,
    seq                  INTEGER
);
CREATE INDEX measured_speeds_key ON measured_speeds (artifact, rung, id);
CREATE INDEX measured_speeds_seq ON measured_speeds (seq);

-- The last 20 measurements of each (file, rung): the core reads their medians.
CREATE VIEW recent_speeds AS
SELECT * FROM (
    SELECT *, ROW_NUMBER() OVER (
        PARTITION BY artifact, artifact_size, artifact_mtime_ns, rung ORDER BY id DESC
    ) AS recency
    FROM measured_speeds
) WHERE recency <= 20;
