-- Times on the record, on the database clock: when a run was created, when its latest claim
-- took it, and when that claim's lease was last renewed (the end of an ended run is its
-- claimable_at, as retention reads it). Rows created before this migration keep created_at
-- NULL, unknown, rather than the migration's time: the default is set after the column exists.
-- None of these columns is indexed, so a renewal stays a HOT update.
ALTER TABLE runs ADD COLUMN created_at TIMESTAMPTZ;
ALTER TABLE runs ALTER COLUMN created_at SET DEFAULT now();
ALTER TABLE runs ADD COLUMN claimed_at TIMESTAMPTZ;
ALTER TABLE runs ADD COLUMN renewed_at TIMESTAMPTZ;
