-- What a child was launched as, so a fitbox that re-executes itself (SIGHUP) or starts
-- after a crash can adopt it as a ready resident without reloading it: its placement (rung,
-- window, slots, cores, footprint per device...) as JSON (box/supervision/adoption.py).
-- NULL: recorded by an older fitbox; such a child is never adopted, only reaped.
ALTER TABLE children ADD COLUMN placement TEXT;
