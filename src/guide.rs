//! The guide: how to use the library, one chapter per topic.
//!
//! Each chapter is a module with no items, whose page is a markdown file of `docs/guide/`
//! (readable as it is in the repository). Its code blocks are compiled and run by
//! `cargo test --doc -p distribution`; the ones that need a server are only compiled.
//!
//! - [`start`]: what a lease and a fence are, the demo and the test command, and adding the
//!   library to a service (features, configuration, shutdown).
//! - [`workers`]: the [`Worker`](crate::Worker), [`RunScope`](crate::RunScope), wake-ups and
//!   the heartbeat hub.
//! - [`retries`]: backoff, the attempt budget, attempt deadlines, failed runs.
//! - [`jobs`]: payloads, kinds, priorities, scheduled and periodic runs, cancel.
//! - [`signals`]: runs that wait for a person or a webhook, and the tokens that answer them.
//! - [`times`]: the times each record carries, and the attempt history.
//! - [`retention`]: purging ended runs, by hand and by the fleet.
//! - [`effects`]: exactly-once effects in your own tables, and at group-commit speed.
//! - [`guarantees`]: what is guaranteed, what is not, and how it is checked.
//! - [`backends`]: choosing a backend by URL.
//! - [`metrics`]: the metrics the library reports, and its tracing.
//! - [`layout`]: the workspace's crates, and the stability policy.
//! - [`development`]: the test command's cost groups, the commands for each part, benchmarks.
//!
//! The `lease` command (operator commands, `lease run`, `lease worker`, the dashboard) is
//! described in `lease-cli/README.md`.

pub mod start {
    #![doc = include_str!("../docs/guide/start.md")]
}

pub mod workers {
    #![doc = include_str!("../docs/guide/workers.md")]
}

pub mod retries {
    #![doc = include_str!("../docs/guide/retries.md")]
}

pub mod jobs {
    #![doc = include_str!("../docs/guide/jobs.md")]
}

pub mod signals {
    #![doc = include_str!("../docs/guide/signals.md")]
}

pub mod times {
    #![doc = include_str!("../docs/guide/times.md")]
}

pub mod retention {
    #![doc = include_str!("../docs/guide/retention.md")]
}

pub mod effects {
    #![doc = include_str!("../docs/guide/effects.md")]
}

pub mod guarantees {
    #![doc = include_str!("../docs/guide/guarantees.md")]
}

pub mod backends {
    #![doc = include_str!("../docs/guide/backends.md")]
}

pub mod metrics {
    #![doc = include_str!("../docs/guide/metrics.md")]
}

pub mod layout {
    #![doc = include_str!("../docs/guide/layout.md")]
}

pub mod development {
    #![doc = include_str!("../docs/guide/development.md")]
}
