-- A load that ran out of memory: the window is out of reach for that file and placement
-- class until a load at or above it succeeds (core/ask.py window_cap). A fact: an event.
CREATE TABLE refused_windows (
    id                 INTEGER PRIMARY KEY,
    artifact           TEXT NOT NULL,
    artifact_size      INTEGER NOT NULL,
    artifact_mtime_ns  INTEGER NOT NULL,
    placement          TEXT NOT NULL,
    window             INTEGER NOT NULL,
    type_k             TEXT NOT NULL,
    type_v             TEXT NOT NULL,
    detail             TEXT,            -- the engine's line that said so
    call_id            INTEGER,         -- the call whose load failed
    measured_at        REAL NOT NULL,
    seq                INTEGER
);
CREATE INDEX refused_windows_seq ON refused_windows (seq);
