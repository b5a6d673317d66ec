-- Each box's proof of identity: the sha256 (hex) of a secret the central mints at its first
-- registration and returns to it once. A register naming a known box id must present it;
-- a box registered before this (NULL here) gets one at its first register from the address
-- on record (central/identity.py).
ALTER TABLE boxes ADD COLUMN secret_hash TEXT;
