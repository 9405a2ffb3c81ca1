//! The listening side of a backend's wake-ups: one session at a time, opened again when it
//! ends, each message handed to the backend's parser. Shared by the adapters, which bring the
//! session (`LISTEN`, `SUBSCRIBE`) and the message format.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lease_core::{Kind, Wakes};
use tokio_util::sync::CancellationToken;

use crate::wake::WakesExt;

/// The first pause before opening a session again after a failure, doubled up to
/// [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// The longest pause between two attempts to open a session.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// An open session of a backend's wake-up channel.
#[async_trait::async_trait]
pub trait WakeSession: Send {
    /// The next message's payload, or `None` once the session has ended (closed, cut, failed):
    /// what is sent after that is not received.
    async fn next(&mut self) -> Option<String>;
}

/// Opens a session; `attempt` counts the sessions opened or tried before (a backend with
/// several places to listen tries them in turn).
pub type OpenSession = Box<
    dyn FnMut(usize) -> Pin<Box<dyn Future<Output = Result<Box<dyn WakeSession>, String>> + Send>>
        + Send,
>;

/// A store's wake-ups and the task that listens for them: started by the first
/// [`wakes`](WakeListener::wakes) call, stopped when the listener is dropped (keep it in an
/// `Arc` shared by the store's clones).
///
/// While no session is open the [`Wakes`] are not live, so workers poll; each new session
/// first sends [`Wake::All`](lease_core::Wake::All) (what was sent while none was open is lost),
/// then is marked live.
#[derive(Debug)]
pub struct WakeListener {
    wakes: Wakes,
    started: AtomicBool,
    stop: CancellationToken,
}

impl Drop for WakeListener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Default for WakeListener {
    fn default() -> Self {
        WakeListener::new()
    }
}

impl WakeListener {
    /// A listener not started yet, its wake-ups not live.
    pub fn new() -> WakeListener {
        WakeListener {
            wakes: Wakes::not_live(),
            started: AtomicBool::new(false),
            stop: CancellationToken::new(),
        }
    }

    /// The store's wake-ups. The first call starts listening (within a Tokio runtime):
    /// `open` (called only then) makes the session opener, and `parse` reads each payload
    /// ([`WakesExt::deliver`]). `what` names the channel in the logs.
    pub fn wakes(
        &self,
        what: &str,
        open: impl FnOnce() -> OpenSession,
        parse: fn(&str) -> Option<(Kind, Duration)>,
    ) -> Wakes {
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(listen(
                what.to_owned(),
                open(),
                parse,
                self.wakes.clone(),
                self.stop.clone(),
            ));
        }
        self.wakes.clone()
    }
}

async fn listen(
    what: String,
    mut open: OpenSession,
    parse: fn(&str) -> Option<(Kind, Duration)>,
    wakes: Wakes,
    stop: CancellationToken,
) {
    let mut retry = FIRST_RETRY;
    // Whether the current streak of failures was logged as a warning already.
    let mut warned = false;
    let mut attempt = 0;
    loop {
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            opened = open(attempt) => opened,
        };
        attempt += 1;
        let mut session = match opened {
            Ok(session) => session,
            Err(e) => {
                wakes.set_live(false);
                if warned {
                    tracing::debug!(error = %e, retry_in = ?retry, what, "cannot listen for wake-ups; the workers poll meanwhile");
                } else {
                    warned = true;
                    tracing::warn!(error = %e, retry_in = ?retry, what, "cannot listen for wake-ups; the workers poll meanwhile");
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    () = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(MAX_RETRY);
                continue;
            }
        };
        retry = FIRST_RETRY;
        warned = false;
        tracing::debug!(what, "listening for wake-ups");
        // Sent before the flag, so a receiver that sees the flag has it queued.
        wakes.wake_all();
        wakes.set_live(true);
        loop {
            let message = tokio::select! {
                _ = stop.cancelled() => return,
                message = session.next() => message,
            };
            match message {
                Some(payload) => wakes.deliver(&payload, parse),
                None => {
                    tracing::debug!(what, "the wake-up session ended; listening again");
                    break;
                }
            }
        }
        wakes.set_live(false);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A session that hands out its messages, then ends.
    struct Scripted(VecDeque<String>);

    #[async_trait::async_trait]
    impl WakeSession for Scripted {
        async fn next(&mut self) -> Option<String> {
            match self.0.pop_front() {
                Some(m) => Some(m),
                None => {
                    // Ended after a pause, so the test sees it live first.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    None
                }
            }
        }
    }

    fn parse(payload: &str) -> Option<(Kind, Duration)> {
        Some((Kind::new(payload).ok()?, Duration::ZERO))
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_or_ended_session_is_opened_again_and_wakes_every_kind() {
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let seen = attempts.clone();
        let listener = WakeListener::new();
        let wakes = listener.wakes(
            "test",
            move || {
                Box::new(move |attempt: usize| {
                    seen.lock().unwrap().push(attempt);
                    Box::pin(async move {
                        if attempt == 0 {
                            return Err("refused".to_owned());
                        }
                        let session: Box<dyn WakeSession> =
                            Box::new(Scripted(VecDeque::from(["email".to_owned()])));
                        Ok(session)
                    })
                        as Pin<
                            Box<dyn Future<Output = Result<Box<dyn WakeSession>, String>> + Send>,
                        >
                })
            },
            parse,
        );
        let mut rx = wakes.subscribe();
        assert!(!rx.is_live(), "live before any session");
        // The refused first attempt, then a session: a wake for all, then the message.
        let email = Kind::new("email").unwrap();
        tokio::time::timeout(Duration::from_secs(1), rx.woken(&[]))
            .await
            .expect("Wake::All");
        assert!(rx.is_live());
        tokio::time::timeout(
            Duration::from_secs(1),
            rx.woken(std::slice::from_ref(&email)),
        )
        .await
        .expect("the session's message");
        // It ends: not live, opened again (a third attempt), Wake::All again.
        tokio::time::timeout(Duration::from_secs(1), rx.woken(&[]))
            .await
            .expect("Wake::All again");
        assert!(
            attempts.lock().unwrap().len() >= 3,
            "{:?}",
            attempts.lock().unwrap()
        );
        drop(listener);
    }
}
