-- The central's own store (its own sequence: the box's migrations never run here).
-- api_keys has the box's shape (store/keys.py reads both), with one more scope: worker,
-- which may only register a box.
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

-- Each box by its own persistent id. admin_key is the box's key the registration handed
-- over: the central calls the box with it (the store file is owner-only).
CREATE TABLE boxes (
    box_id         TEXT PRIMARY KEY,
    name           TEXT NOT NULL,
    version        TEXT NOT NULL,
    url            TEXT NOT NULL,
    admin_key      TEXT NOT NULL,
    registered_at  REAL NOT NULL,
    last_seen_at   REAL,
    counter        INTEGER
);

-- Where the mirror of each (box, table) has read to: written in the same transaction as
-- the rows it covers, so a restart of either side resumes with nothing lost or twice.
CREATE TABLE mirror_cursors (
    box_id  TEXT NOT NULL,
    tbl     TEXT NOT NULL,
    cursor  INTEGER NOT NULL,
    PRIMARY KEY (box_id, tbl)
);

-- Every mirrored row, keyed by (box, table, the row's id on the box): a row that changes on
-- the box (a call that ends) replaces its earlier form. data is the row as the box sent it.
CREATE TABLE mirrored_rows (
    box_id     TEXT NOT NULL,
    tbl        TEXT NOT NULL,
    source_id  INTEGER NOT NULL,
    seq        INTEGER,
    data       TEXT NOT NULL,
    PRIMARY KEY (box_id, tbl, source_id)
);

-- A row the mirror could not take (a value of a type it does not expect), kept as the box
-- sent it with the reason; the rest of the sync goes on. Keyed like a mirrored row when it
-- has an id, so a replay of it is not kept twice.
CREATE TABLE mirror_rejects (
    box_id     TEXT NOT NULL,
    tbl        TEXT NOT NULL,
    source_id  TEXT NOT NULL,
    raw        TEXT NOT NULL,
    reason     TEXT NOT NULL,
    at         REAL NOT NULL,
    PRIMARY KEY (box_id, tbl, source_id)
);
