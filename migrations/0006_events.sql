-- The change counter: one row per event (a call row written or changed, a fact measured,
-- an operator action, a child starting or ending). Sensor readings never add rows here.
-- Each cursor table carries seq = the event that last changed the row, so a mirror that
-- replays "seq > my cursor" gets every new row and every changed row once per change.
CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    kind    TEXT NOT NULL,
    tbl     TEXT NOT NULL,
    row_id  INTEGER NOT NULL
);
ALTER TABLE call_log ADD COLUMN seq INTEGER;
ALTER TABLE operator_actions ADD COLUMN seq INTEGER;
ALTER TABLE measured_footprints ADD COLUMN seq INTEGER;
ALTER TABLE children ADD COLUMN seq INTEGER;
CREATE INDEX call_log_seq ON call_log (seq);
CREATE INDEX operator_actions_seq ON operator_actions (seq);
CREATE INDEX measured_footprints_seq ON measured_footprints (seq);
CREATE INDEX children_seq ON children (seq);
