//! The adapter's detailed failures, folded into [`lease_core::Error`] by one `From` impl.

use lease_core::Error;

/// Tags every error this adapter reports.
pub(crate) const BACKEND: &str = "postgres";

/// What went wrong talking to Postgres. No message holds a password: URLs are shown through
/// [`lease_core::redact_url`], and sqlx's own messages never quote the connection URL (its
/// parse errors name what is wrong, the server names the role, not the password).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PgError {
    /// The server could not be reached, dropped the connection, or the pool timed out.
    #[error("{0}")]
    Unreachable(String),
    /// Any other driver or database failure.
    #[error("{0}")]
    Failed(String),
    /// A row the schema guarantees was malformed (a corrupt or foreign table).
    #[error("corrupt row in {table}: {why}")]
    Corrupt { table: &'static str, why: String },
    /// The configuration was refused before connecting, or the server is set up so that the
    /// store's promises cannot be kept.
    #[error("{0}")]
    Config(String),
    /// The server refused to wait any longer (a lock wait, a statement or an idle transaction
    /// outlived its bound), or is not the primary, or a write is not durable where it must be.
    #[error("{0}")]
    Busy(String),
    /// The server is a standby (read-only), not the primary; the store moves to another host.
    #[error("{0}")]
    Standby(String),
}

impl From<sqlx::Error> for PgError {
    fn from(e: sqlx::Error) -> PgError {
        let message = e.to_string();
        if let sqlx::Error::Database(db) = &e {
            if db.code().as_deref() == Some("25006") {
                return PgError::Standby(format!(
                    "the server is a read-only standby, not the primary; retry once the store \
                     has found the primary ({message})"
                ));
            }
        }
        if message.contains("unsupported startup parameter") {
            // PgBouncer's answer to the session settings the store sends at connect.
            return PgError::Config(format!(
                "a connection pooler refused the store's session settings ({message}): behind \
                 PgBouncer or another pooler in transaction mode, add pooler=transaction to the \
                 URL, which sets them in each transaction instead"
            ));
        }
        if let Some(why) = bounded(&e) {
            PgError::Busy(format!("{why} ({message})"))
        } else if is_unreachable(&e) {
            PgError::Unreachable(message)
        } else {
            PgError::Failed(message)
        }
    }
}

impl From<sqlx::migrate::MigrateError> for PgError {
    fn from(e: sqlx::migrate::MigrateError) -> PgError {
        match e {
            sqlx::migrate::MigrateError::Execute(e) => PgError::from(e),
            other => PgError::Failed(format!("migration failed: {other}")),
        }
    }
}

impl From<PgError> for Error {
    fn from(e: PgError) -> Error {
        match e {
            PgError::Unreachable(_) | PgError::Busy(_) | PgError::Standby(_) => {
                Error::unavailable(BACKEND, e)
            }
            PgError::Config(_) => Error::misconfigured(BACKEND, e),
            other => Error::backend(BACKEND, other),
        }
    }
}

/// Explains a server error after which a retry on the **same server** can succeed (a wait this
/// adapter bounded, the server short of disk, memory or connections, a serialization failure
/// or deadlock): retryable, without moving to another host, and saying what happened.
fn bounded(e: &sqlx::Error) -> Option<&'static str> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    Some(match &*db.code()? {
        "55P03" => {
            "a row this operation needs is locked by another transaction (a fenced \
                    transaction in progress) for longer than lock_timeout; retry"
        }
        "25P03" => {
            "the server ended this transaction: it stayed idle longer than its bound \
                    (idle_in_transaction_session_timeout); nothing it wrote was committed"
        }
        "57014" => {
            "the server cancelled the statement: it outlived its bound \
                    (statement_timeout); nothing this transaction wrote was committed"
        }
        "25P02" => {
            "the transaction was already aborted by an earlier error; nothing it wrote \
                    was committed"
        }
        "57P05" => {
            "the server closed this idle session (idle_session_timeout); the next call \
                    opens a new one"
        }
        "53100" => "the server's disk is full; nothing this statement wrote was committed",
        "53200" => "the server is out of memory; nothing this statement wrote was committed",
        "53300" => "the server has no connection slot free (max_connections); retry later",
        "40001" => {
            "a serialization failure; nothing this statement wrote was committed, retry \
                    on the same server"
        }
        "40P01" => {
            "the statement was chosen as a deadlock victim; nothing it wrote was \
                    committed, retry on the same server"
        }
        _ => return None,
    })
}

/// Whether retrying may help: the connection failed, not the statement.
fn is_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exception; 57P01-03: shutdown / cannot connect now.
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database error with `code`, as the server would send it.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "server error {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "server error"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn classify(code: &'static str) -> PgError {
        PgError::from(sqlx::Error::Database(Box::new(Coded(code))))
    }

    #[test]
    fn each_server_error_says_whether_to_retry_and_where() {
        // (SQLSTATE, class): Busy is retryable on the same server, Unreachable is retryable
        // after moving to another host, Standby moves too, Failed is not retryable.
        let table = [
            ("57P05", "busy"), // idle_session_timeout
            ("53100", "busy"), // disk full
            ("53200", "busy"), // out of memory
            ("53300", "busy"), // too many connections
            ("40001", "busy"), // serialization failure
            ("40P01", "busy"), // deadlock detected
            ("55P03", "busy"), // lock_timeout
            ("57014", "busy"), // statement_timeout
            ("25P03", "busy"), // idle_in_transaction_session_timeout
            ("08006", "unreachable"),
            ("57P01", "unreachable"), // admin shutdown
            ("25006", "standby"),
            ("23505", "failed"), // unique violation
            ("42P01", "failed"), // undefined table
        ];
        for (code, class) in table {
            let ours = classify(code);
            let seen = match &ours {
                PgError::Busy(_) => "busy",
                PgError::Unreachable(_) => "unreachable",
                PgError::Standby(_) => "standby",
                _ => "failed",
            };
            assert_eq!(seen, class, "{code}: {ours}");
            let core = Error::from(ours);
            assert_eq!(core.is_retryable(), class != "failed", "{code}: {core}");
        }
    }
}
