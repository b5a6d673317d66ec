-- A person's say over each box: a name of their own for it (shown, and found by, instead of
-- the host name the box registers) and drain (bare-name calls go to other boxes; BOX/MODEL
-- still reaches it). Both outlive the box's registrations.
ALTER TABLE boxes ADD COLUMN label TEXT;
ALTER TABLE boxes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
