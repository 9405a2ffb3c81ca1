-- The store's own wake-ups (notify.rs), sent after the writes that made runs claimable have
-- committed, many in one statement. $1: the schema (the channel is the one the runs_wake trigger
-- notifies); $2: the kinds; $3: the milliseconds until each is claimable, or NULL when $4 gives
-- the instant instead (µs since the Unix epoch on the database clock), counted from now here.
-- The commit is asynchronous: a notification is delivered when its transaction commits and
-- has nothing to make durable, so no one waits for a flush while holding the queue lock.
SELECT pg_notify('lease_wake_' || md5($1),
           t.kind || ' ' || coalesce(t.ms,
               greatest(0, ceil((t.at - extract(epoch FROM clock_timestamp()) * 1000000) / 1000))::bigint))
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit,
     unnest($2::text[], $3::bigint[], $4::bigint[]) AS t(kind, ms, at)
