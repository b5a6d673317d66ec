-- What `fitbox scout` found: one row per model file it saw, with what led to it. A cursor
-- table (an event per finding), so a central can mirror it. ``evidence`` is live (a running
-- process uses it now, a store or cache holds it now) or historical (fitbox's store saw it
-- once); ``servable`` is set only once the file's GGUF header was read.
CREATE TABLE scout_findings (
    id          INTEGER PRIMARY KEY,
    at          REAL NOT NULL,
    path        TEXT NOT NULL,
    name        TEXT,
    bytes       INTEGER,
    source      TEXT NOT NULL,     -- root | hf_cache | ollama | lmstudio | process | store
    evidence    TEXT NOT NULL,     -- live | historical
    led_by      TEXT NOT NULL,     -- what led to it, for a person: "manifest of llama3:8b"
    servable    INTEGER NOT NULL,  -- 1 only when its GGUF header was read
    detail      TEXT,              -- the header's facts, or why it is not servable
    seq         INTEGER
);
CREATE INDEX scout_findings_seq ON scout_findings (seq);
