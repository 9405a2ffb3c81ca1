-- $1 run_ids (text[])
-- Returns: one row per input, in input order (ord); the record's columns are null (run_id too)
-- for a run that does not exist or was purged. Primary-key lookups, linear in the batch.
SELECT i.ord, r.run_id, r.state, r.lease_owner,
       (extract(epoch FROM r.lease_expires_at) * 1000000)::bigint AS expires_us, r.fence,
       r.heartbeats, (extract(epoch FROM now()) * 1000000)::bigint AS observed_us,
       CASE WHEN r.state = 'runnable' AND r.lease_owner IS NULL AND r.claimable_at > now()
            THEN (extract(epoch FROM r.claimable_at) * 1000000)::bigint END AS not_before_us,
       CASE WHEN r.state = 'runnable' AND r.lease_owner IS NULL AND r.claimable_at <= now()
            THEN (extract(epoch FROM r.claimable_at) * 1000000)::bigint END AS claimable_since_us,
       (extract(epoch FROM r.created_at) * 1000000)::bigint AS created_us,
       (extract(epoch FROM r.claimed_at) * 1000000)::bigint AS claimed_us,
       (extract(epoch FROM r.renewed_at) * 1000000)::bigint AS renewed_us,
       CASE WHEN r.state IN ('completed', 'failed', 'cancelled')
            THEN (extract(epoch FROM r.claimable_at) * 1000000)::bigint END AS ended_us,
       r.failure, r.attempts, r.kind, r.queue, r.priority,
       r.wait_name, (extract(epoch FROM r.wait_deadline) * 1000000)::bigint AS wait_deadline_us,
       r.wait_fence, r.resumed_name, r.resumed_fence,
       (extract(epoch FROM r.resumed_at) * 1000000)::bigint AS resumed_at_us, r.resumed_payload,
       (SELECT p.payload FROM {schema}.run_payloads p WHERE p.run_id = r.run_id) AS payload,
       (SELECT p.trace_parent FROM {schema}.run_payloads p WHERE p.run_id = r.run_id) AS trace_parent
FROM unnest($1::text[]) WITH ORDINALITY AS i(run_id, ord)
LEFT JOIN {schema}.runs r ON r.run_id = i.run_id COLLATE "C"
ORDER BY i.ord
