-- $1 the quoted schema name
-- Behind a transaction pooler (pooler.rs): points the migrating transaction, and no later one
-- of the server session, at the store's schema, as set_search_path.sql does for a session.
SELECT set_config('search_path', $1, true)
