-- What operators did to the box (load, unload, pin, unpin, refresh-models), by whom.
CREATE TABLE operator_actions (
    id       INTEGER PRIMARY KEY,
    at       REAL NOT NULL,
    action   TEXT NOT NULL,
    target   TEXT,
    origin   TEXT,             -- the caller's address
    key_id   TEXT,             -- the admin key used, NULL for the box itself
    outcome  TEXT NOT NULL,    -- ok | error
    detail   TEXT
);
