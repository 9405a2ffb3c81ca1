-- $1 how far to raise (2^32)
-- Part of a rebind, in its transaction: raises every run's fence and the schema's fence floor
-- by $1, so that no fence the history before a restore issued can be issued again (a fence
-- within $1 of i64::MAX goes to i64::MAX, at which a run is never claimed again).
-- Returns: how many runs were raised, and the floor after.
WITH raised AS (
         UPDATE {schema}.runs
         SET fence = CASE WHEN fence > 9223372036854775807 - $1 THEN 9223372036854775807
                          ELSE fence + $1 END
         RETURNING 1),
     floor AS (
         UPDATE {schema}.fence_floor
         SET fence = CASE WHEN fence > 9223372036854775807 - $1 THEN 9223372036854775807
                          ELSE fence + $1 END
         RETURNING fence)
SELECT (SELECT count(*) FROM raised) AS runs, (SELECT fence FROM floor) AS floor
