-- Heartbeats as HOT updates. Renewals now change only lease_expires_at and heartbeats, which no
-- index covers (nor any partial-index predicate), so Postgres can write the new row version on
-- the same page without new index entries, as long as the page has room: the fillfactor keeps
-- 20% of each page free for that. (Existing pages are not rewritten; new ones honour it.)
--
-- claimable_at changes meaning for a held run: it is the expiry as of the claim, or as of the
-- last time claim_next moved the run's index entry forward, no longer kept equal to the expiry
-- by every renewal. claim_next checks the lease itself and moves such lagging entries forward;
-- runs_held is how it finds them without walking the unowned runs queued at the head of
-- runs_claimable. Renewals change no column it covers either.
ALTER TABLE runs SET (fillfactor = 80);

CREATE INDEX runs_held ON runs (claimable_at) WHERE state = 'runnable' AND lease_owner IS NOT NULL;
