-- A run's payload: the bytes it was created with, immutable for its life. In a table of its
-- own, so the runs rows stay narrow: claims, renewals and ends rewrite a run's row (renewals
-- as HOT updates that need room on the row's page), and a payload of up to 64 KiB would be
-- copied or crowd those pages. A run created without a payload has no row here (NULL and an
-- empty payload stay apart). Written by create in the create's statement, read by claims and
-- inspect by primary key, deleted by purge with the journal. No foreign key: a runs row is
-- never deleted (purge keeps it as the tombstone), and the writes above keep the two in step.
CREATE TABLE run_payloads (
    run_id  TEXT COLLATE "C" PRIMARY KEY,
    payload BYTEA NOT NULL
);
