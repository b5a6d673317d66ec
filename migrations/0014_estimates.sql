-- What the placement priced a load at before the engine said what it holds: the estimate
-- error of every measured load (/metrics) is (estimate - measured) / measured. The basis is
-- "estimate" (file headers) or "measured" (an earlier load of the same key).
ALTER TABLE measured_footprints ADD COLUMN estimate_bytes INTEGER;
ALTER TABLE measured_footprints ADD COLUMN estimate_basis TEXT;
