-- $1 run_id
-- Returns: what a refused claim or fenced write is judged against, or no row if the run does
-- not exist. remaining_us is the holder's time left by the database clock; delay_us the time
-- left before an unowned run given back with a retry delay is claimable.
-- The clock is read when the row is, not at the transaction's start (now()): a release that
-- began after this statement's transaction did but committed before its snapshot stamps the
-- run claimable at a now() later than ours, and would read as a delay of a few hundred
-- microseconds on a run given back with none. Every commit this read sees began before
-- clock_timestamp(), so a release without a delay never reads as one; a claim refused for that
-- reason (it waited on the release's lock with an earlier now()) is tried again.
SELECT state, lease_owner, fence,
       (extract(epoch FROM lease_expires_at - clock.now) * 1000000)::bigint AS remaining_us,
       CASE WHEN lease_owner IS NULL AND claimable_at > clock.now
            THEN (extract(epoch FROM claimable_at - clock.now) * 1000000)::bigint END AS delay_us
FROM {schema}.runs CROSS JOIN (SELECT clock_timestamp() AS now) clock
WHERE run_id = $1
