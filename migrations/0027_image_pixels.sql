-- The pixels an image call produced (width x height, summed over its images), as audio_out_s
-- says what a speech call produced: the outputs' bytes and sha256 are in files.
ALTER TABLE call_log ADD COLUMN image_pixels INTEGER;
