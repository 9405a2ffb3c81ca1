-- $1 run_id
-- Returns: what a refused claim or fenced write is judged against, or no row if the run does
-- not exist. remaining_us is the holder's time left by the database clock; delay_us the time
-- left before an unowned run given back with a retry delay is claimable.
SELECT state, lease_owner, fence,
       (extract(epoch FROM lease_expires_at - now()) * 1000000)::bigint AS remaining_us,
       CASE WHEN lease_owner IS NULL AND claimable_at > now()
            THEN (extract(epoch FROM claimable_at - now()) * 1000000)::bigint END AS delay_us
FROM {schema}.runs WHERE run_id = $1
