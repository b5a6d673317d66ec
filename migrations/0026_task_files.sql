-- What a task call (speech, transcription, images) took in and gave out: each file's role
-- (input or output), name, bytes and sha256 as a JSON list, never its content; and the
-- audio seconds it consumed (a transcription's upload) or produced (speech).
ALTER TABLE call_log ADD COLUMN files TEXT;
ALTER TABLE call_log ADD COLUMN audio_in_s REAL;
ALTER TABLE call_log ADD COLUMN audio_out_s REAL;
