-- Whether the store's schema ($1, its name) has sqlx's migration bookkeeping table: a catalog
-- read that runs no DDL and locks nothing.
SELECT to_regclass(format('%I._sqlx_migrations', $1::text)) IS NOT NULL AS migrated
