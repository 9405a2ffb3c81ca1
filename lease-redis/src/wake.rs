//! Wake-ups over Redis pub/sub: the scripts that make a run claimable `PUBLISH` its class and
//! the milliseconds until it is claimable on the namespace's channel (`common.lua`'s `wake`),
//! and one subscribed connection per store turns the messages into [`Wakes`] for every
//! worker of the store.
//!
//! A message is a hint. A subscription that drops loses what was published meanwhile, so
//! every new one starts with a wake-up for every kind, and the workers' fallback poll covers
//! the rest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lease_core::{CancellationToken, Kind, Wakes};

use crate::keys::decode_kind;
use crate::link::Link;

/// The longest pause between two attempts to subscribe.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// A store's wake-ups: the channel its workers subscribe to, and the subscribing task,
/// started by the first subscriber and stopped when the last clone of the store is dropped.
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

    /// The store's wake-ups; the first call subscribes to `channel` through `link`.
    pub(crate) fn wakes(&self, link: &Arc<Link>, channel: String) -> Wakes {
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(listen(
                link.clone(),
                channel,
                self.wakes.clone(),
                self.stop.clone(),
            ));
        }
        self.wakes.clone()
    }
}

/// Subscribes, one connection at a time, until `stop`.
async fn listen(link: Arc<Link>, channel: String, wakes: Wakes, stop: CancellationToken) {
    let mut retry = Duration::from_millis(100);
    // Whether the current streak of failures was logged as a warning already.
    let mut warned = false;
    let mut attempt = 0;
    loop {
        let subscribed = tokio::select! {
            _ = stop.cancelled() => return,
            subscribed = link.subscribe(&channel, attempt) => subscribed,
        };
        attempt += 1;
        let pubsub = match subscribed {
            Ok(pubsub) => pubsub,
            Err(e) => {
                wakes.set_live(false);
                if warned {
                    tracing::debug!(error = %e, retry_in = ?retry, "cannot subscribe to wake-ups; the workers poll meanwhile");
                } else {
                    warned = true;
                    tracing::warn!(error = %e, retry_in = ?retry, "cannot subscribe to wake-ups; the workers poll meanwhile");
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
        tracing::debug!(channel, "subscribed to wake-ups");
        // What was published while nothing was subscribed is lost: try every kind.
        // Sent before the flag, so a receiver that sees the flag has it queued.
        wakes.wake_all();
        wakes.set_live(true);
        let mut messages = pubsub.into_on_message();
        loop {
            let message = tokio::select! {
                _ = stop.cancelled() => return,
                message = messages.next() => message,
            };
            match message {
                Some(message) => match message.get_payload::<String>() {
                    Ok(payload) => deliver(&wakes, &payload),
                    Err(_) => wakes.wake_all(),
                },
                None => {
                    tracing::debug!("the wake-up subscription was closed; subscribing again");
                    break;
                }
            }
        }
        wakes.set_live(false);
    }
}

/// `<class> <ms>` to a wake-up: the class is the claimable index key's part after
/// `:claimable` (`""` for the default kind, `:<kind in hex>`, then `:p<priority>` above
/// priority 0). Anything else wakes every kind.
fn deliver(wakes: &Wakes, payload: &str) {
    match parse(payload) {
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

fn parse(payload: &str) -> Option<(Kind, Duration)> {
    let (class, ms) = payload.rsplit_once(' ')?;
    let delay = Duration::from_millis(ms.parse().ok()?);
    // The priority does not matter to a wake-up.
    let class = match class.rfind(":p") {
        Some(at) if class[at + 2..].bytes().all(|b| b.is_ascii_digit()) => &class[..at],
        _ => class,
    };
    let kind = match class {
        "" => Kind::default(),
        hex => decode_kind(hex.strip_prefix(':')?)?,
    };
    Some((kind, delay))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Class, Keys};

    #[test]
    fn messages_name_the_class_of_the_index_the_scripts_wrote() {
        let keys = Keys::new("ns");
        for (kind, priority) in [("default", 0), ("default", 3), ("send mail", 0), ("p:1", 9)] {
            let class = Class {
                kind: Kind::new(kind).unwrap(),
                priority,
            };
            let key = keys.claimable_of(&class);
            let suffix = key
                .strip_prefix(&format!("{}:claimable", keys.tag()))
                .unwrap();
            let (parsed, delay) = parse(&format!("{suffix} 250")).unwrap();
            assert_eq!(parsed, class.kind, "{key}");
            assert_eq!(delay, Duration::from_millis(250));
        }
        for bad in ["", "0", ":zz 0", ":61 x", "nospace"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
