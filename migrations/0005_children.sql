-- Every engine child fitbox starts, so that one left behind by a crash can be found and
-- stopped at the next start. A process is ours only if pid AND its start time match.
CREATE TABLE children (
    id           INTEGER PRIMARY KEY,
    pid          INTEGER NOT NULL,
    create_time  REAL NOT NULL,     -- psutil create_time: tells a reused pid apart
    port         INTEGER,
    artifact     TEXT,
    argv         TEXT NOT NULL,     -- JSON list
    started_at   REAL NOT NULL,
    ended_at     REAL,
    ended_how    TEXT              -- stopped | exited | reaped at start | gone
);
CREATE INDEX children_open ON children (ended_at);
