-- The vision projector a footprint was measured with (--mmproj beside the model): its
-- path, size and mtime as "path|size|mtime_ns". NULL: measured without one, or not known
-- (a row from before this column, or imported from another box). A measurement without a
-- projector prices a model now paired with one as measured + the projector's estimate; one
-- with a projector other than the model's now does not price it (box/asks.py).
ALTER TABLE measured_footprints ADD COLUMN projector TEXT;
