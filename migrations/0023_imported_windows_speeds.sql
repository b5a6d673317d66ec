-- Refused windows and measured speeds another box measured for a file with the same sha256,
-- imported (POST /v1/facts/import, offered by a central) as footprints are (0018): filed
-- under this box's own file, labelled with the box that measured it and its row id there.
-- NULL origin_box: measured here. This box's own measurement is preferred once it has one
-- (box/facts.py, box/speeds.py).
ALTER TABLE refused_windows ADD COLUMN origin_box TEXT;
ALTER TABLE refused_windows ADD COLUMN origin_id INTEGER;
CREATE UNIQUE INDEX refused_windows_origin
    ON refused_windows (origin_box, origin_id, artifact) WHERE origin_box IS NOT NULL;
ALTER TABLE measured_speeds ADD COLUMN origin_box TEXT;
ALTER TABLE measured_speeds ADD COLUMN origin_id INTEGER;
CREATE UNIQUE INDEX measured_speeds_origin
    ON measured_speeds (origin_box, origin_id, artifact) WHERE origin_box IS NOT NULL;

-- The recent windows are kept apart by origin: 20 speeds imported after this box's own do
-- not push its own out of the medians it reads.
DROP VIEW recent_speeds;
CREATE VIEW recent_speeds AS
SELECT * FROM (
    SELECT *, ROW_NUMBER() OVER (
        PARTITION BY artifact, artifact_size, artifact_mtime_ns, rung, origin_box IS NULL
        ORDER BY id DESC
    ) AS recency
    FROM measured_speeds
) WHERE recency <= 20;

DROP VIEW recent_curve;
CREATE VIEW recent_curve AS
SELECT * FROM (
    SELECT artifact, artifact_size, artifact_mtime_ns, rung, cores, decode_per_token_ms, id,
        origin_box,
        ROW_NUMBER() OVER (
            PARTITION BY artifact, artifact_size, artifact_mtime_ns, rung, origin_box IS NULL
            ORDER BY id DESC
        ) AS recency
    FROM measured_speeds
    WHERE cores IS NOT NULL AND cores > 0 AND decode_per_token_ms IS NOT NULL
) WHERE recency <= 60;
