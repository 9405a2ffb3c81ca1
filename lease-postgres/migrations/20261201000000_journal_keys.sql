-- Idempotency keys: a keyed append (append_keyed) stores its key with the journal entry, and the
-- same key again answers that entry instead of appending another. Keys are per run; unkeyed
-- entries carry none. The partial unique index is both the lookup and the guarantee.
ALTER TABLE journal ADD COLUMN idem_key TEXT COLLATE "C";

CREATE UNIQUE INDEX journal_idem_key ON journal (run_id, idem_key) WHERE idem_key IS NOT NULL;
