-- The box's own id: a UUID made once, at the first start, and kept. A central knows the box
-- by it (never by its hostname: two boxes can share one), so a box that moves port or
-- address re-registers as the same box. One row, ever.
CREATE TABLE box_identity (
    only_row    INTEGER PRIMARY KEY CHECK (only_row = 1),
    box_id      TEXT NOT NULL,
    created_at  REAL NOT NULL
);
