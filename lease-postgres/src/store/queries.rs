//! The store's statements: every file of `sql/`, rendered once per store.

/// The statements, with `{schema}` replaced by the store's quoted schema.
#[derive(Debug)]
pub(crate) struct Queries {
    pub(crate) create: String,
    pub(crate) inspect: String,
    pub(crate) inspect_many: String,
    pub(crate) claim: String,
    pub(crate) claim_next: String,
    pub(crate) explain: String,
    pub(crate) renew: String,
    pub(crate) renew_many: String,
    pub(crate) renew_many_explain: String,
    pub(crate) end_many: String,
    pub(crate) create_many: String,
    pub(crate) unique_holder: String,
    pub(crate) unique_holders: String,
    pub(crate) purge: String,
    pub(crate) purge_ids: String,
    pub(crate) count_purgeable: String,
    pub(crate) count: String,
    pub(crate) count_kinds: String,
    pub(crate) pause_queue: String,
    pub(crate) queues: String,
    pub(crate) queue_kinds: String,
    pub(crate) no_jit: String,
    pub(crate) append: String,
    pub(crate) append_keyed: String,
    pub(crate) journal: String,
    pub(crate) end_lease: String,
    pub(crate) resume: String,
    pub(crate) signal: String,
    pub(crate) force_release: String,
    pub(crate) cancel: String,
    pub(crate) list: String,
    pub(crate) lock_run: String,
    pub(crate) lock_many: String,
    pub(crate) create_schema: String,
    pub(crate) set_search_path: String,
    pub(crate) migrate_lock: String,
    pub(crate) schema_migrated: String,
    pub(crate) schema_version: String,
}

/// `schema` as a double-quoted identifier, its quotes doubled: safe whatever its characters.
pub(crate) fn quoted(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// A statement of `sql/` as a store runs it in `schema`. Identifiers cannot be bound as
/// parameters, so the schema is spliced in, quoted (any characters are safe inside a
/// double-quoted identifier once its quotes are doubled), and so are the contract's numbers a
/// statement needs (nothing in the SQL spells them): the attempt history's cap and the highest
/// priority. For the benchmarks and tests that run the statements themselves.
#[doc(hidden)]
pub fn render_sql(sql: &str, schema: &str) -> String {
    sql.replace("{schema}", &quoted(schema))
        .replace("{max_history}", &lease_core::MAX_HISTORY.to_string())
        .replace("{max_priority}", &lease_core::MAX_PRIORITY.to_string())
}

impl Queries {
    /// The statements for `schema`. Behind a transaction pooler (`pooled`) every statement
    /// runs in an explicit transaction begun a round trip before it (`pooler.rs`), so the
    /// statements judge on `statement_timestamp()`, the time the statement reached the
    /// server, where they otherwise read `now()`, the start of their own implicit
    /// transaction: the same instant, and never the `BEGIN`'s, which a worker paused between
    /// the two messages would otherwise be judged at.
    pub(crate) fn new(schema: &str, pooled: bool) -> Queries {
        let q = |sql: &str| {
            let sql = render_sql(sql, schema);
            if pooled {
                sql.replace("now()", "statement_timestamp()")
            } else {
                sql
            }
        };
        Queries {
            create: q(include_str!("../../sql/create.sql")),
            inspect: q(include_str!("../../sql/inspect.sql")),
            inspect_many: q(include_str!("../../sql/inspect_many.sql")),
            claim: q(include_str!("../../sql/claim.sql")),
            claim_next: q(include_str!("../../sql/claim_next.sql")),
            explain: q(include_str!("../../sql/explain.sql")),
            renew: q(include_str!("../../sql/renew.sql")),
            renew_many: q(include_str!("../../sql/renew_many.sql")),
            renew_many_explain: q(include_str!("../../sql/renew_many_explain.sql")),
            end_many: q(include_str!("../../sql/end_many.sql")),
            create_many: q(include_str!("../../sql/create_many.sql")),
            unique_holder: q(include_str!("../../sql/unique_holder.sql")),
            unique_holders: q(include_str!("../../sql/unique_holders.sql")),
            purge: q(concat!(
                include_str!("../../sql/purge.sql"),
                include_str!("../../sql/purge_remove.sql")
            )),
            purge_ids: q(concat!(
                include_str!("../../sql/purge_ids.sql"),
                include_str!("../../sql/purge_remove.sql")
            )),
            count_purgeable: q(include_str!("../../sql/count_purgeable.sql")),
            count: q(concat!(
                include_str!("../../sql/runnable_parts.sql"),
                include_str!("../../sql/count.sql")
            )),
            count_kinds: q(concat!(
                include_str!("../../sql/runnable_parts.sql"),
                include_str!("../../sql/count_kinds.sql")
            )),
            pause_queue: q(include_str!("../../sql/pause_queue.sql")),
            queues: q(concat!(
                include_str!("../../sql/runnable_parts.sql"),
                include_str!("../../sql/queues.sql")
            )),
            queue_kinds: q(concat!(
                include_str!("../../sql/runnable_parts.sql"),
                include_str!("../../sql/queue_kinds.sql")
            )),
            no_jit: q(include_str!("../../sql/no_jit.sql")),
            append: q(include_str!("../../sql/append.sql")),
            append_keyed: q(include_str!("../../sql/append_keyed.sql")),
            journal: q(include_str!("../../sql/journal.sql")),
            end_lease: q(include_str!("../../sql/end_lease.sql")),
            resume: q(include_str!("../../sql/resume.sql")),
            signal: q(include_str!("../../sql/signal.sql")),
            force_release: q(include_str!("../../sql/force_release.sql")),
            cancel: q(include_str!("../../sql/cancel.sql")),
            list: q(include_str!("../../sql/list.sql")),
            lock_run: q(include_str!("../../sql/lock_run.sql")),
            lock_many: q(include_str!("../../sql/lock_many.sql")),
            create_schema: q(include_str!("../../sql/create_schema.sql")),
            set_search_path: q(include_str!("../../sql/set_search_path.sql")),
            migrate_lock: q(include_str!("../../sql/migrate_lock.sql")),
            schema_migrated: q(include_str!("../../sql/schema_migrated.sql")),
            schema_version: q(include_str!("../../sql/schema_version.sql")),
        }
    }
}

#[cfg(test)]
mod tests {
    /// The one number of the contract a migration spells: the priority column's range (a
    /// migration is fixed once applied and `sqlx::migrate!` embeds it as written, so it cannot
    /// be rendered). This ties it to `lease_core::MAX_PRIORITY`: change the limit and this
    /// fails until a migration moves the constraint with it.
    #[test]
    fn the_priority_constraint_is_the_contracts_range() {
        let migration = include_str!("../../migrations/20261208000000_run_priority.sql");
        let bound = migration
            .split("CHECK (priority BETWEEN 0 AND ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .and_then(|n| n.parse::<u8>().ok())
            .expect("the migration constrains priority to 0..=N");
        assert_eq!(bound, lease_core::MAX_PRIORITY);
    }

    /// Every number the statements need comes rendered from the contract: none is left as a
    /// placeholder once rendered.
    #[test]
    fn rendering_leaves_no_placeholder() {
        let sql = super::render_sql(include_str!("../../sql/end_many.sql"), "s");
        assert!(!sql.contains("{max_history}") && !sql.contains("{schema}"));
        assert!(sql.contains(&lease_core::MAX_HISTORY.to_string()));
        let sql = super::render_sql(include_str!("../../sql/claim_next.sql"), "s");
        assert!(!sql.contains("{max_priority}") && !sql.contains("{max_history}"));
    }
}
