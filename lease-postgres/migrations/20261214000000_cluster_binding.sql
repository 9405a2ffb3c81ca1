-- Restore safety: the schema is bound to the cluster it was created on and to that cluster's
-- timeline, so that a server whose history went back (point-in-time recovery, a base backup
-- restored, a standby promoted that had not received every claim) is refused before it can
-- issue again fences it issued before, until an operator rebinds it (`lease pg-rebind`), which
-- raises every fence past anything the old history could have issued.
--
-- system_identifier is pg_control_system().system_identifier: set by initdb, kept by a base
-- backup and by every standby made from one, new for a cluster made by initdb or dump/restore.
-- timeline is the timeline WAL is written on now, read as the first 8 hex digits of
-- pg_walfile_name(pg_current_wal_lsn()): a point-in-time recovery and a promotion start a new
-- one. pg_control_checkpoint().timeline_id would be the timeline of the last checkpoint, which
-- after a promotion stays the old one until the first checkpoint on the new timeline, so a
-- connection in between would see no change. On PostgreSQL 15, pg_control_system(),
-- pg_control_checkpoint(), pg_current_wal_lsn() and pg_walfile_name() are executable by PUBLIC
-- (no privilege is needed, checked with a role that has none); pg_walfile_name() fails on a
-- standby, where the store never runs its statements.
CREATE TABLE cluster_binding (
    one               BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    system_identifier BIGINT NOT NULL,
    timeline          BIGINT NOT NULL CHECK (timeline > 0),
    bound_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- First use binds: the server that runs this migration.
INSERT INTO cluster_binding (system_identifier, timeline)
SELECT (SELECT system_identifier FROM pg_control_system()),
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
