//! Wake-ups over `LISTEN/NOTIFY`: the `runs_wake` trigger notifies the schema's channel when a
//! write that leaves a run claimable commits, and one listening session per store turns the
//! notifications into [`Wakes`] for every worker of the store.
//!
//! A notification is a hint. A session that drops loses what was sent meanwhile, so every new
//! session starts with a wake-up for every kind, and the workers' fallback poll covers the rest.

// `kind delay_ms`, as the trigger sends it.
use lease_core::parse_kind_delay as parse;
use lease_core::Wakes;
use lease_runtime::{OpenSession, WakeListener, WakeSession};
use sqlx::postgres::{PgListener, PgPool};

/// The store's wake-ups; the first call starts listening on sessions of `pool`.
pub(crate) fn wakes(listener: &WakeListener, pool: &PgPool, schema: &str) -> Wakes {
    let opener = || -> OpenSession {
        let (pool, schema) = (pool.clone(), schema.to_owned());
        Box::new(move |_attempt| {
            let (pool, schema) = (pool.clone(), schema.clone());
            Box::pin(async move {
                let session: Box<dyn WakeSession> = Box::new(Session(
                    open(&pool, &schema).await.map_err(|e| e.to_string())?,
                ));
                Ok(session)
            })
        })
    };
    listener.wakes(&format!("postgres schema {schema}"), opener, parse)
}

/// A listening session: its notifications until it fails or is closed.
struct Session(PgListener);

#[async_trait::async_trait]
impl WakeSession for Session {
    async fn next(&mut self) -> Option<String> {
        match self.0.try_recv().await {
            Ok(Some(notification)) => Some(notification.payload().to_owned()),
            // Closed (`Ok(None)`) or failed: the listener opens a new session.
            Ok(None) | Err(_) => None,
        }
    }
}

/// A session listening on the schema's channel (its name computed by the server, as the
/// trigger computes it).
async fn open(pool: &PgPool, schema: &str) -> Result<PgListener, sqlx::Error> {
    let channel: String = sqlx::query_scalar("SELECT 'lease_wake_' || md5($1)")
        .bind(schema)
        .fetch_one(pool)
        .await?;
    let mut session = PgListener::connect_with(pool).await?;
    session.listen(&channel).await?;
    Ok(session)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lease_core::Kind;
    use lease_runtime::WakesExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn payloads_name_the_kind_before_the_last_space() {
        let wakes = Wakes::new();
        let mut rx = wakes.subscribe();
        let kind = Kind::new("send mail").unwrap();
        wakes.deliver("send mail 0", parse);
        tokio::time::timeout(
            Duration::from_secs(1),
            rx.woken(std::slice::from_ref(&kind)),
        )
        .await
        .expect("the kind with a space was not woken");
        let start = tokio::time::Instant::now();
        wakes.deliver("send mail 1500", parse);
        rx.woken(std::slice::from_ref(&kind)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(1500));
        // Unreadable: every kind.
        wakes.deliver("nodelay", parse);
        let other = Kind::new("other").unwrap();
        tokio::time::timeout(Duration::from_secs(1), rx.woken(&[other]))
            .await
            .expect("an unreadable payload did not wake every kind");
    }
}
