//! Wake-ups over `LISTEN/NOTIFY`: the `runs_wake` trigger notifies the schema's channel when a
//! write that leaves a run claimable commits, and one listening session per store turns the
//! notifications into [`Wakes`] for every worker of the store.
//!
//! A notification is a hint. A session that drops loses what was sent meanwhile, so every new
//! session starts with a wake-up for every kind, and the workers' fallback poll covers the rest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lease_core::{CancellationToken, Kind, Wakes};
use sqlx::postgres::{PgListener, PgPool};

/// The longest pause between two attempts to open a listening session.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// A store's wake-ups: the channel its workers subscribe to, and the listening task, started
/// by the first subscriber and stopped when the last clone of the store is dropped.
pub(crate) struct Listening {
    wakes: Wakes,
    started: AtomicBool,
    stop: CancellationToken,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Listening {
    pub(crate) fn new() -> Listening {
        Listening {
            wakes: Wakes::not_live(),
            started: AtomicBool::new(false),
            stop: CancellationToken::new(),
        }
    }

    /// The store's wake-ups; the first call starts listening on a session of `pool`.
    pub(crate) fn wakes(&self, pool: &PgPool, schema: &str) -> Wakes {
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(listen(
                pool.clone(),
                schema.to_owned(),
                self.wakes.clone(),
                self.stop.clone(),
            ));
        }
        self.wakes.clone()
    }
}

/// Opens listening sessions, one at a time, until `stop`.
async fn listen(pool: PgPool, schema: String, wakes: Wakes, stop: CancellationToken) {
    let mut retry = Duration::from_millis(100);
    // Whether the current streak of failures was logged as a warning already.
    let mut warned = false;
    loop {
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            opened = open(&pool, &schema) => opened,
        };
        let mut session = match opened {
            Ok(session) => session,
            Err(e) => {
                wakes.set_live(false);
                if warned {
                    tracing::debug!(error = %e, retry_in = ?retry, "cannot listen for wake-ups; the workers poll meanwhile");
                } else {
                    warned = true;
                    tracing::warn!(error = %e, retry_in = ?retry, "cannot listen for wake-ups; the workers poll meanwhile");
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    () = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
        };
        retry = Duration::from_millis(100);
        warned = false;
        tracing::debug!(schema, "listening for wake-ups");
        // What was notified while no session listened is lost: try every kind.
        // Sent before the flag, so a receiver that sees the flag has it queued.
        wakes.wake_all();
        wakes.set_live(true);
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => return,
                received = session.try_recv() => received,
            };
            match received {
                Ok(Some(notification)) => deliver(&wakes, notification.payload()),
                Ok(None) => {
                    tracing::debug!("the wake-up session was closed; listening again");
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the wake-up session failed; listening again");
                    break;
                }
            }
        }
        wakes.set_live(false);
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

/// `kind delay_ms` (split at the last space: a kind may hold spaces) to a wake-up; anything
/// else wakes every kind.
fn deliver(wakes: &Wakes, payload: &str) {
    let parsed = payload.rsplit_once(' ').and_then(|(kind, ms)| {
        Some((
            Kind::new(kind).ok()?,
            Duration::from_millis(ms.parse().ok()?),
        ))
    });
    match parsed {
        Some((kind, delay)) => wakes.wake_after(&kind, delay),
        None => {
            tracing::warn!(
                payload,
                "a wake-up the store cannot read; waking every kind"
            );
            wakes.wake_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn payloads_name_the_kind_before_the_last_space() {
        let wakes = Wakes::new();
        let mut rx = wakes.subscribe();
        let kind = Kind::new("send mail").unwrap();
        deliver(&wakes, "send mail 0");
        tokio::time::timeout(
            Duration::from_secs(1),
            rx.woken(std::slice::from_ref(&kind)),
        )
        .await
        .expect("the kind with a space was not woken");
        let start = tokio::time::Instant::now();
        deliver(&wakes, "send mail 1500");
        rx.woken(std::slice::from_ref(&kind)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(1500));
        // Unreadable: every kind.
        deliver(&wakes, "nodelay");
        let other = Kind::new("other").unwrap();
        tokio::time::timeout(Duration::from_secs(1), rx.woken(&[other]))
            .await
            .expect("an unreadable payload did not wake every kind");
    }
}
