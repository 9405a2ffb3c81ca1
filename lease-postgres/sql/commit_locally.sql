-- (no parameters)
-- This transaction's commit waits for the local flush only, not for synchronous standbys: the
-- binding's own bookkeeping (sql/binding_write.sql from a connection check), which a failover
-- may lose harmlessly (it is recorded again) and which must not wait for a standby a promoted
-- server does not have yet.
SET LOCAL synchronous_commit = local
