-- The thread curve (FORMULAS.md §CPU claims) survives a restart: each measured speed keeps
-- how many physical cores the engine ran on (NULL: a GPU-only engine, or a row measured
-- before this migration), and a restarted box places with the curve it measured.
ALTER TABLE measured_speeds ADD COLUMN cores INTEGER;

-- The last 60 decode rates of each (file, rung) that carry their core count: the curve a
-- claim reads (box/speeds.py CURVE_WINDOW).
CREATE VIEW recent_curve AS
SELECT * FROM (
    SELECT artifact, artifact_size, artifact_mtime_ns, rung, cores, decode_per_token_ms, id,
        ROW_NUMBER() OVER (
            PARTITION BY artifact, artifact_size, artifact_mtime_ns, rung ORDER BY id DESC
        ) AS recency
    FROM measured_speeds
    WHERE cores IS NOT NULL AND cores > 0 AND decode_per_token_ms IS NOT NULL
) WHERE recency <= 60;
