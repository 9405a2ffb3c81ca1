//! What the `lease` binary's test files share: the private PostgreSQL they run against.

use lease_conformance::fixtures::{unavailable, PostgresServer};

/// A private PostgreSQL (or `DATABASE_URL`'s) and its URL; `None` only with the opt-out
/// variable `unavailable` names, else a missing server fails the test.
pub(crate) fn postgres() -> Option<(PostgresServer, String)> {
    match PostgresServer::start() {
        Ok(server) => {
            let url = server.url();
            Some((server, url))
        }
        Err(why) => unavailable(
            "postgres",
            why,
            "install postgresql (bash scripts/test.sh does it)",
        ),
    }
}
