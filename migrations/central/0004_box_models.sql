-- Each box's model list as the mirror last read it (JSON): after a restart of the central,
-- a model whose box has not answered yet is known (503, retry later), not unknown (404).
ALTER TABLE boxes ADD COLUMN models TEXT;
