-- The attempt budget's counter: claims since the run was created or resumed, less those that
-- ended voluntarily (release, suspend, a snooze). Every claim adds one in the claim's own
-- statement; a release, a suspend or a retry-after gives it back in the end's. A claim whose
-- holder failed, timed out or vanished (a crash leaves no end) stays counted. Create (and the
-- revival of a purged id) and resume start it at 0. Distinct from the fence, which counts
-- every claim for good. A constant default: added without rewriting the table.
ALTER TABLE runs ADD COLUMN attempts BIGINT NOT NULL DEFAULT 0 CHECK (attempts >= 0);
