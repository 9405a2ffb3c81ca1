//! Private database servers for the whole-system tests.
//!
//! These tests cut one loopback address off from the server, so they always start their own
//! servers (listening on 127.0.0.1, .2 and .3) rather than using `DATABASE_URL`/`REDIS_URL`.

use lease_conformance::fixtures::{unavailable, unique_namespace, PostgresServer, RedisServer};

/// Which backend a scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Postgres,
    Redis,
}

/// A running private server; stopped on drop.
pub(crate) enum Server {
    Postgres(PostgresServer),
    Redis(RedisServer),
}

impl Server {
    /// Starts a private server of `kind`, or returns `None` after saying why (a failure in CI).
    pub(crate) fn start(kind: Kind) -> Option<Server> {
        match kind {
            Kind::Postgres => match PostgresServer::start() {
                Ok(s) => Some(Server::Postgres(s)),
                Err(why) => unavailable(
                    "postgres",
                    why,
                    "install postgresql (bash scripts/test.sh does it)",
                ),
            },
            Kind::Redis => match RedisServer::start() {
                Ok(s) => Some(Server::Redis(s)),
                Err(why) => unavailable(
                    "redis",
                    why,
                    "install redis-server (bash scripts/test.sh does it)",
                ),
            },
        }
    }

    /// The server's URL, reached through loopback address `host`.
    pub(crate) fn url_via(&self, host: &str) -> String {
        match self {
            Server::Postgres(s) => s.url_via(host),
            Server::Redis(s) => s.url_via(host),
        }
    }

    /// The server's port.
    pub(crate) fn port(&self) -> u16 {
        match self {
            Server::Postgres(s) => s.port(),
            Server::Redis(s) => s.port(),
        }
    }

    /// A namespace valid on this backend, unique to this test.
    pub(crate) fn namespace(&self, what: &str) -> String {
        unique_namespace(&format!("it_{what}"))
    }
}
