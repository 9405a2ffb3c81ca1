-- Unique jobs: a run may carry a unique key, and while it is live (runnable: waiting,
-- scheduled, held or retrying; or suspended) no other run with the same key can be created.
-- The partial index holds only live runs' keys, so a run that ends gives its key up with the
-- write that ends it, and a purge has nothing more to remove. Two creates racing with one key
-- meet in the index: the second waits for the first's commit and then creates nothing.
ALTER TABLE runs ADD COLUMN unique_key TEXT COLLATE "C";
CREATE UNIQUE INDEX runs_live_unique_key ON runs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('runnable', 'suspended');
