-- (no parameters; {schema} is the quoted schema name)
-- Points the migration connection at the store's schema, so the migrations and sqlx's own
-- _sqlx_migrations table land in it.
SET search_path TO {schema}
