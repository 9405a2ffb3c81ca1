-- (no parameters)
-- A durability barrier: a transaction that writes one WAL record (a transactional logical
-- message, which needs no table and no privilege) so that its commit, synchronous on the
-- store's sessions, is flushed and waits for the synchronous standbys. Everything inserted in
-- the WAL before it, any session's asynchronous commit included, is then flushed too: the
-- standbys flush WAL in order. A commit that only took an xid would not be waited for.
SELECT pg_logical_emit_message(true, 'lease-postgres', '')::text AS lsn
