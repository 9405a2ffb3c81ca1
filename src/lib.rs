#![doc = include_str!("../README.md")]

mod config;

pub use config::{
    check_namespace, connect, connect_store, Backend, Config, ConfigError, Store,
    MAX_NAMESPACE_BYTES,
};

pub use lease_core::*;
/// The Postgres backend (the `postgres` feature).
#[cfg(feature = "postgres")]
pub use lease_postgres as postgres;
/// The Redis backend (the `redis` feature).
#[cfg(feature = "redis")]
pub use lease_redis as redis;

#[cfg(test)]
mod tests {
    /// The README's metrics table lists every series the library reports, with its type.
    #[test]
    fn every_metric_is_in_the_readme_table() {
        let readme = include_str!("../README.md");
        for (name, kind, ..) in lease_core::observe::SERIES {
            let row = format!("| `{name}` | {kind} |");
            assert!(readme.contains(&row), "README lacks the row {row}");
        }
    }
}
