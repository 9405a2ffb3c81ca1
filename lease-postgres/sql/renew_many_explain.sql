-- $1 run_ids (text[]): the leases of a renew_many.sql batch that were not renewed
-- Returns: for each of those runs that exists, the row its refusal is judged against; no row
-- for a run that does not exist. A plain read: it never waits for a row lock, and a row locked
-- by another transaction reads as it was before that transaction.
-- One primary-key probe per input, forced by LATERAL … OFFSET 0 whatever the plan.
SELECT f.run_id, f.state, f.lease_owner, f.fence
FROM unnest($1::text[]) AS i(run_id)
CROSS JOIN LATERAL (
    SELECT r.run_id, r.state, r.lease_owner, r.fence
    FROM {schema}.runs r
    WHERE r.run_id = i.run_id COLLATE "C"
    OFFSET 0
) AS f
