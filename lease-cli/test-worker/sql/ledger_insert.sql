-- $1 run_id, $2 effect, $3 fence, $4 worker_id
INSERT INTO {schema}.worker_ledger (run_id, effect, fence, worker_id) VALUES ($1, $2, $3, $4)
