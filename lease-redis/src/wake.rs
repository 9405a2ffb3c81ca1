//! Wake-ups over Redis pub/sub: the scripts that make a run claimable `PUBLISH` its class and
//! the milliseconds until it is claimable on the namespace's channel (`common.lua`'s `wake`),
//! and one subscribed connection per store turns the messages into [`Wakes`] for every
//! worker of the store.
//!
//! A message is a hint. A subscription that drops loses what was published meanwhile, so
//! every new one starts with a wake-up for every kind, and the workers' fallback poll covers
//! the rest.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lease_core::{Kind, Wakes};
use lease_runtime::{OpenSession, WakeListener, WakeSession};

use crate::keys::decode_kind;
use crate::link::Link;

/// The store's wake-ups; the first call subscribes to `channel` through `link`.
pub(crate) fn wakes(listener: &WakeListener, link: &Arc<Link>, channel: String) -> Wakes {
    let what = format!("redis channel {channel}");
    let opener = || -> OpenSession {
        let link = link.clone();
        Box::new(move |attempt| {
            let (link, channel) = (link.clone(), channel.clone());
            Box::pin(async move {
                let pubsub = link
                    .subscribe(&channel, attempt)
                    .await
                    .map_err(|e| e.to_string())?;
                let session: Box<dyn WakeSession> = Box::new(Session(pubsub.into_on_message()));
                Ok(session)
            })
        })
    };
    listener.wakes(&what, opener, parse)
}

/// A subscribed connection: its messages until it is closed.
struct Session(redis::aio::PubSubStream);

#[async_trait::async_trait]
impl WakeSession for Session {
    async fn next(&mut self) -> Option<String> {
        // A payload that is not text reads as empty, which wakes every kind.
        let message = self.0.next().await?;
        Some(message.get_payload::<String>().unwrap_or_default())
    }
}

/// `<class> <ms>`: the class is the claimable index key's part after `:claimable` (`""` for
/// the default kind, `:<kind in hex>`, then `:p<priority>` above priority 0, then
/// `:q<queue in hex>` for a queue other than the default).
fn parse(payload: &str) -> Option<(Kind, Duration)> {
    let (class, ms) = payload.rsplit_once(' ')?;
    let delay = Duration::from_millis(ms.parse().ok()?);
    // Nor does the queue: a worker serving the kind in any queue tries it.
    let class = match class.rfind(":q") {
        Some(at) if class[at + 2..].bytes().all(|b| b.is_ascii_hexdigit()) => &class[..at],
        _ => class,
    };
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
        for (kind, priority, queue) in [
            ("default", 0, "default"),
            ("default", 3, "default"),
            ("send mail", 0, "default"),
            ("p:1", 9, "default"),
            ("default", 0, "q:1"),
            ("send mail", 4, "mailers"),
        ] {
            let class = Class {
                kind: Kind::new(kind).unwrap(),
                priority,
                queue: lease_core::Queue::new(queue).unwrap(),
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
