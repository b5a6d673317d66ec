-- Weight files hashed once: the whole file's sha256 and the sha256 of each fixed chunk,
-- keyed by where the file really is (symlinks resolved) and what it was when hashed. A file
-- whose size or mtime changed is hashed again (its old row is replaced).
CREATE TABLE file_hashes (
    path         TEXT PRIMARY KEY,   -- the real path (symlinks resolved)
    size         INTEGER NOT NULL,
    mtime_ns     INTEGER NOT NULL,
    sha256       TEXT NOT NULL,
    chunk_bytes  INTEGER NOT NULL,
    chunks       TEXT NOT NULL,      -- JSON list of each chunk's sha256, in order
    hashed_at    REAL NOT NULL,
    seconds      REAL                -- how long hashing took
);
CREATE INDEX file_hashes_sha256 ON file_hashes (sha256);

-- A pull's duration: bytes / seconds is its throughput.
ALTER TABLE pulls ADD COLUMN seconds REAL;
