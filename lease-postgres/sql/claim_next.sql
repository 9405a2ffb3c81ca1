-- $1 worker_id, $2 ttl_ms, $3 max, $4 most lagging index entries to move forward, $5 kind,
-- $6 queue (nothing is claimed while it is paused: sql/pause_queue.sql)
-- Returns: the claimed runs with their fences, expiries, attempt counts (each claim counts),
-- priorities, payloads (read by primary key, only for the runs claimed) and how long each had
-- been claimable (waited_us, on the database clock), the highest priority first, then those
-- claimable longest first.
--
-- The pick walks the kind's and queue's parts of the runs_claimable index (kind, priority, queue,
-- claimable_at, created_seq), a priority at a time from the highest down (each of the ten
-- priorities is tried, an empty one at the cost of one index probe; evaluated only as far as the
-- pick reads), and each priority's claimable range is walked in claimable order until $3 runs are
-- picked. Other kinds' and queues' runs are neither claimed nor walked past. Renewals do not move
-- claimable_at forward (so they stay HOT updates), so a held run's entry keeps the expiry of its
-- claim and, once that instant passes, lags: it sits at the head of its priority's range while the
-- lease is still held. The pick checks the lease in the scan's own filter, before LIMIT, so lagging
-- entries are walked past and never cost a claimable run its place; and the statement moves up to
-- $4 of the kind's lagging entries (found through runs_held) to claimable_at = lease_expires_at, so
-- they do not pile up.
--
-- Order: by priority, then index order, which is for an unowned run the instant it became
-- claimable and for an expired run the expiry of its claim or, if its entry was moved since,
-- the expiry as of that move: earlier than its true expiry if it was renewed after, by at most
-- about one TTL plus the time between claim_next calls. Within the batch the runs are returned
-- by priority, then by when each became claimable in truth: the expiry for an expired run,
-- else claimable_at.
--
-- The updates find their rows by primary key (= ANY of an array), whatever the planner
-- estimates for the limits, and the answer is assembled by grouping, not by joining the CTEs.
--
-- Planned once per session: the limits and the kind are read through sub-selects, which no
-- plan sees through, so a plan made for the arguments costs what the generic plan costs and
-- the server keeps the generic one after its first five runs. Read straight from $3 and $5, a
-- custom plan (LIMIT 3) was costed far below the generic one (a tenth of the table), and the
-- statement was planned on every call: ~0.9 ms a call (tests/plan_cache.rs, BENCHMARKS.md).
WITH levels(priority) AS (
    -- Every priority from the highest down; one that has no claimable run costs one probe of
    -- the index. (A loose index scan found the priorities in use by walking the kind's range
    -- backwards from its newest entries, which in a drain are the held runs' and the dead
    -- versions of the runs just ended: thousands of heap visits a call.)
    -- None while the queue is paused: the pause is read in this statement's snapshot.
    SELECT p::smallint FROM generate_series({max_priority}, 0, -1) AS p
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.queues q
                      WHERE q.queue = (SELECT $6::text) AND q.paused)
), picked AS (
    -- Runs waiting for a signal past their wait's deadline first (the claim ends each wait as
    -- timed out): few, and never starved by a busy kind. Then the claimable runs.
    SELECT waits.*
    FROM (
        SELECT run_id, wait_deadline AS claimable_at, created_seq, priority,
               wait_deadline AS claimable_since
        FROM {schema}.runs
        WHERE state = 'suspended' AND wait_deadline IS NOT NULL
          AND kind = (SELECT $5::text)
          AND queue = (SELECT $6::text)
          AND wait_deadline <= now()
          AND fence < 9223372036854775807
          AND NOT EXISTS (SELECT 1 FROM {schema}.queues q
                          WHERE q.queue = (SELECT $6::text) AND q.paused)
        ORDER BY kind, queue, wait_deadline
        LIMIT (SELECT $3::bigint)
        FOR UPDATE SKIP LOCKED
    ) AS waits
    UNION ALL
    SELECT level.*
    FROM levels CROSS JOIN LATERAL (
        SELECT run_id, claimable_at, created_seq, priority,
               coalesce(lease_expires_at, claimable_at) AS claimable_since
        FROM {schema}.runs
        WHERE state = 'runnable'
          AND kind = (SELECT $5::text)
          AND priority = levels.priority
          AND queue = (SELECT $6::text)
          AND claimable_at <= now()
          AND (lease_owner IS NULL OR lease_expires_at <= now())
          AND CASE WHEN claimed_at IS NULL
                   THEN greatest(fence, (SELECT f.fence FROM {schema}.fence_floor f))
                   ELSE fence END < 9223372036854775807
        ORDER BY kind, priority, queue, claimable_at, created_seq
        LIMIT (SELECT $3::bigint)
        FOR UPDATE SKIP LOCKED
    ) AS level
    LIMIT (SELECT $3::bigint)
), claimed AS (
    UPDATE {schema}.runs r
    SET state = 'runnable',
        lease_owner = $1,
        lease_expires_at = now() + $2::bigint * interval '1 millisecond',
        claimable_at = now() + $2::bigint * interval '1 millisecond',
        -- A timed-out wait ends as such, with a fresh budget (sql/claim.sql).
        resumed_name = CASE WHEN r.state = 'suspended' THEN r.wait_name ELSE r.resumed_name END,
        resumed_fence = CASE WHEN r.state = 'suspended' THEN r.wait_fence ELSE r.resumed_fence END,
        resumed_at = CASE WHEN r.state = 'suspended' THEN r.wait_deadline ELSE r.resumed_at END,
        resumed_payload = CASE WHEN r.state = 'suspended' THEN NULL ELSE r.resumed_payload END,
        wait_name = NULL, wait_fence = NULL, wait_deadline = NULL,
        -- A life's first claim starts above the fence floor, as in sql/claim.sql.
        fence = CASE WHEN r.claimed_at IS NULL
                     THEN greatest(r.fence, (SELECT f.fence FROM {schema}.fence_floor f))
                     ELSE r.fence END + 1,
        attempts = CASE WHEN r.state = 'suspended' THEN 1 ELSE r.attempts + 1 END,
        claimed_at = now(),
        renewed_at = NULL,
        -- An expired lease taken over: its attempt ended at its expiry.
        history = CASE WHEN r.lease_owner IS NULL THEN r.history
                       ELSE {schema}.attempt_pushed(r.history, {max_history},
                                                    r.attempts, r.fence, r.lease_owner,
                                                    r.claimed_at, r.lease_expires_at, 'expired',
                                                    NULL) END
    WHERE r.run_id = ANY ((SELECT array_agg(picked.run_id) FROM picked)::text[])
    RETURNING r.run_id, r.fence, r.lease_expires_at, r.attempts, r.priority, r.resumed_name,
              r.resumed_fence, r.resumed_at, r.resumed_payload
), lagging AS (
    -- Held runs of the kind whose entry lags (claimable_at passed, lease still held), of any
    -- priority.
    SELECT run_id
    FROM {schema}.runs
    WHERE state = 'runnable'
      AND lease_owner IS NOT NULL
      AND kind = (SELECT $5::text)
      AND claimable_at <= now()
      AND lease_expires_at > now()
    ORDER BY kind, claimable_at
    LIMIT (SELECT $4::bigint)
    FOR UPDATE SKIP LOCKED
), moved AS (
    -- The lock re-checked that each is still held, so its expiry is not null.
    UPDATE {schema}.runs r
    SET claimable_at = r.lease_expires_at
    WHERE r.run_id = ANY ((SELECT array_agg(lagging.run_id) FROM lagging)::text[])
      AND r.lease_expires_at IS NOT NULL
)
SELECT part.run_id, max(part.fence) AS fence, max(part.expires_us) AS expires_us,
       max(part.attempts) AS attempts, max(part.priority) AS priority,
       (extract(epoch FROM now() - max(part.claimable_since)) * 1000000)::bigint AS waited_us,
       max(part.resumed_name) AS resumed_name, max(part.resumed_fence) AS resumed_fence,
       (extract(epoch FROM max(part.resumed_at)) * 1000000)::bigint AS resumed_at_us,
       (array_agg(part.resumed_payload) FILTER (WHERE part.fence IS NOT NULL))[1] AS resumed_payload,
       (SELECT p.payload FROM {schema}.run_payloads p WHERE p.run_id = part.run_id) AS payload,
       (SELECT p.trace_parent FROM {schema}.run_payloads p WHERE p.run_id = part.run_id)
           AS trace_parent
FROM (
    SELECT claimed.run_id, claimed.fence,
           (extract(epoch FROM claimed.lease_expires_at) * 1000000)::bigint AS expires_us,
           claimed.attempts, claimed.priority,
           NULL::timestamptz AS claimable_since, NULL::bigint AS created_seq,
           claimed.resumed_name, claimed.resumed_fence, claimed.resumed_at,
           claimed.resumed_payload
    FROM claimed
    UNION ALL
    SELECT picked.run_id, NULL, NULL, NULL, NULL, picked.claimable_since, picked.created_seq,
           NULL, NULL, NULL, NULL
    FROM picked
) AS part
GROUP BY part.run_id
HAVING count(part.fence) = 1
ORDER BY max(part.priority) DESC, max(part.claimable_since), max(part.created_seq)
