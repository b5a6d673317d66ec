-- A footprint another box measured for a file with the same sha256, imported
-- (POST /v1/facts/import, offered by a central): filed under this box's own file, labelled
-- with the box that measured it and its row id there. NULL origin_box: measured here. A
-- measurement made here always wins over an imported one for the same key (box/facts.py).
ALTER TABLE measured_footprints ADD COLUMN origin_box TEXT;
ALTER TABLE measured_footprints ADD COLUMN origin_id INTEGER;
-- an offer made twice (a central replaying its mirror) is kept once
CREATE UNIQUE INDEX measured_footprints_origin
    ON measured_footprints (origin_box, origin_id, artifact) WHERE origin_box IS NOT NULL;
