-- What the engine reported it allocated, per load: the measured footprint of one placement.
-- Keyed by the artifact (path + size + mtime, so a replaced file is measured anew), the
-- device it was placed on, and the contract it was loaded under. Bytes come from the
-- child's -lv 4 load log; call_id is the call whose load measured it.
CREATE TABLE measured_footprints (
    id                 INTEGER PRIMARY KEY,
    artifact           TEXT NOT NULL,
    artifact_size      INTEGER NOT NULL,
    artifact_mtime_ns  INTEGER NOT NULL,
    device             TEXT NOT NULL,
    window             INTEGER NOT NULL,
    parallel           INTEGER NOT NULL,
    type_k             TEXT NOT NULL,
    type_v             TEXT NOT NULL,
    weights_bytes      INTEGER NOT NULL,
    kv_bytes           INTEGER NOT NULL,
    compute_bytes      INTEGER NOT NULL,
    output_bytes       INTEGER NOT NULL,
    n_ctx              INTEGER,
    n_ctx_seq          INTEGER,
    load_seconds       REAL,
    call_id            INTEGER,
    measured_at        REAL NOT NULL
);
CREATE INDEX measured_footprints_key
    ON measured_footprints (artifact, device, window, parallel, type_k, type_v);
