-- Operator settings that outlive a restart: box-wide knobs, per-model (pair) knobs, and the
-- box tier of the capacity limits. One row per knob; value is JSON.
CREATE TABLE settings (
    scope       TEXT NOT NULL,             -- box | pair | limits
    model       TEXT NOT NULL DEFAULT '',  -- the model name for scope = pair, else ''
    name        TEXT NOT NULL,
    value       TEXT NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (scope, model, name)
);
