-- cancel: a terminal 'cancelled' state, reached from any state but completed, with the reason
-- given in `failure` (the column holds why a run ended: its holder's End::Fail or a cancel).
-- Each new check is looser than the one it replaces, so every row already satisfies it: added
-- NOT VALID (no scan under the table lock), then validated under a lock writers pass.
ALTER TABLE runs DROP CONSTRAINT runs_state_check;
ALTER TABLE runs ADD CONSTRAINT runs_state_check
    CHECK (state IN ('runnable', 'suspended', 'completed', 'failed', 'purged', 'cancelled'))
    NOT VALID;
ALTER TABLE runs VALIDATE CONSTRAINT runs_state_check;
ALTER TABLE runs DROP CONSTRAINT runs_failure_only_when_failed;
ALTER TABLE runs ADD CONSTRAINT runs_failure_only_when_ended
    CHECK ((failure IS NULL) OR (state IN ('failed', 'cancelled'))) NOT VALID;
ALTER TABLE runs VALIDATE CONSTRAINT runs_failure_only_when_ended;

-- Retention and count find cancelled runs as they find completed and failed ones: for a
-- cancelled run, claimable_at is when it was cancelled.
DROP INDEX runs_ended;
CREATE INDEX runs_ended ON runs (claimable_at) WHERE state IN ('completed', 'failed', 'cancelled');
