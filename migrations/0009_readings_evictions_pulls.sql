-- Sensor readings (host and each GPU, every 250 ms by default). Readings never add an event:
-- the change counter stays still on an idle box. Bounded by retention; replayed by id.
CREATE TABLE resource_log (
    id               INTEGER PRIMARY KEY,
    at               REAL NOT NULL,
    device           TEXT NOT NULL,           -- host | gpu0 | gpu1 ...
    simulated        INTEGER NOT NULL DEFAULT 0,
    total_bytes      INTEGER,
    free_bytes       INTEGER,                 -- MemAvailable on the host, NVML free on a GPU
    fitbox_bytes     INTEGER,                 -- what fitbox's residents hold there
    busy_percent     REAL,                    -- host: all cores; GPU: utilisation when known
    swap_free_bytes  INTEGER
);
CREATE INDEX resource_log_at ON resource_log (at);

-- Every resident that left for a reason other than fitbox stopping: an event.
CREATE TABLE evictions (
    id            INTEGER PRIMARY KEY,
    at            REAL NOT NULL,
    model         TEXT NOT NULL,
    artifact      TEXT,
    devices       TEXT,           -- JSON {device: bytes}
    reason        TEXT NOT NULL,  -- make_room | idle_ttl | contract_change | grow_back | hung | operator
    for_model     TEXT,           -- make_room: the model it made room for
    call_id       INTEGER,        -- make_room: the call that needed the room
    idle_seconds  REAL,
    seq           INTEGER
);
CREATE INDEX evictions_seq ON evictions (seq);

-- Every `fitbox pull`: what was asked, what landed, whether its sha256 was checked: an event.
CREATE TABLE pulls (
    id        INTEGER PRIMARY KEY,
    at        REAL NOT NULL,
    source    TEXT NOT NULL,
    path      TEXT,
    bytes     INTEGER,
    verified  INTEGER NOT NULL DEFAULT 0,
    outcome   TEXT NOT NULL,   -- ok | error
    detail    TEXT,
    seq       INTEGER
);
CREATE INDEX pulls_seq ON pulls (seq);

-- The newest measured footprint of every placement key: what the core is handed.
CREATE VIEW latest_footprints AS
SELECT * FROM measured_footprints WHERE id IN (
    SELECT MAX(id) FROM measured_footprints
    GROUP BY artifact, artifact_size, artifact_mtime_ns, device, window, parallel, type_k, type_v
);
