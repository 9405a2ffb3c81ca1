-- $1 run ids (text[]), $2 unique keys (text[])
-- Returns: why inputs of a batch (sql/create_many.sql) created nothing: each of the ids that
-- exists (unique_key NULL), and the live run holding each of the keys.
SELECT run_id, NULL::text AS unique_key FROM {schema}.runs WHERE run_id = ANY($1::text[])
UNION ALL
SELECT run_id, unique_key FROM {schema}.runs
WHERE unique_key = ANY($2::text[]) AND state IN ('runnable', 'suspended')
