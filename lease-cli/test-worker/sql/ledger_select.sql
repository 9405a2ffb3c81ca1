-- $1 run_id
SELECT effect, fence, worker_id FROM {schema}.worker_ledger WHERE run_id = $1 ORDER BY id
