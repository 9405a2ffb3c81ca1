-- $1 run_id, $2 unique key
-- Returns: why a create of $1 with unique key $2 (sql/create.sql) created nothing: the id
-- itself when a run with it exists, else the live run holding the key; no row when neither
-- (the holder ended since the create looked: the create is tried again).
SELECT run_id FROM (
    SELECT run_id, 0 AS rank FROM {schema}.runs WHERE run_id = $1
    UNION ALL
    SELECT run_id, 1 FROM {schema}.runs
    WHERE unique_key = $2 AND state IN ('runnable', 'suspended')
) AS found
ORDER BY rank
LIMIT 1
