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

/// Explains a server error that ends a wait this adapter bounded, or a write sent to a standby:
/// each is retryable, and says what happened.
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
            // 08: connection exception; 57P01-03: shutdown / cannot connect now;
            // 53300: too many connections; 40001/40P01: serialization failure, deadlock.
            code.starts_with("08")
                || matches!(
                    &*code,
                    "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01"
                )
        }),
        _ => false,
    }
}
