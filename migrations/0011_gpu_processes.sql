-- A compute process appearing on or leaving a GPU: an event (the sensor loop diffs NVML's
-- process list every reading; on a SIMULATED GPU the processes are fitbox's own children
-- placed there, since no driver reports them).
CREATE TABLE gpu_processes (
    id          INTEGER PRIMARY KEY,
    at          REAL NOT NULL,
    device      TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    change      TEXT NOT NULL,      -- appeared | left
    used_bytes  INTEGER,
    ours        INTEGER NOT NULL,   -- one of fitbox's engine children
    simulated   INTEGER NOT NULL DEFAULT 0,
    seq         INTEGER
);
CREATE INDEX gpu_processes_seq ON gpu_processes (seq);
