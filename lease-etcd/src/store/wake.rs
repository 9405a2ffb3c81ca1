//! Wake-ups over an etcd watch: every write that makes a run claimable (a create, a release,
//! a retry delay, a resume, a force-release) puts its kind's wake key `w\0{kind}` (the
//! milliseconds until the run is claimable) in the same transaction, and one watch per store
//! on that family turns the puts into [`Wakes`] for every worker of the store.
//!
//! Claims, renewals and completions put no wake key, so an idle fleet is woken by work, not by
//! the traffic of busy workers. A watch that ends (a member down, a compaction, the client cut
//! off) loses what was put meanwhile: the next one starts with a wake-up for every kind, and
//! the workers' fallback poll covers the rest. An expired lease puts nothing (the fallback
//! poll finds it), as on the other backends.

use std::collections::VecDeque;

use crate::rpc::{EventType, WatchFilterType, WatchOptions, WatchStream};
use lease_core::{parse_kind_delay, Wakes};
use lease_runtime::{OpenSession, WakeSession};

use super::EtcdLeaseStore;
use crate::codec::Keys;

impl EtcdLeaseStore {
    /// The store's wake-ups; the first call starts the watch.
    pub(super) fn wake_ups(&self) -> Option<Wakes> {
        let listener = self.listening.as_ref()?;
        let what = format!("etcd wake keys under {:?}", self.config.prefix());
        let clients: Vec<crate::rpc::Client> =
            self.links.iter().map(|l| l.client.clone()).collect();
        let (keys, family) = (self.keys.clone(), self.keys.wakes());
        let opener = move || -> OpenSession {
            Box::new(move |attempt| {
                // The endpoints in turn: a member that is down is left for the next.
                let mut client = clients[attempt % clients.len()].clone();
                let (keys, family) = (keys.clone(), family.clone());
                Box::pin(async move {
                    let options = WatchOptions::new()
                        .with_prefix()
                        .with_filters([WatchFilterType::NoDelete]);
                    let stream = client
                        .watch(family, Some(options))
                        .await
                        .map_err(|e| e.to_string())?;
                    let session: Box<dyn WakeSession> = Box::new(Session {
                        stream,
                        keys,
                        pending: VecDeque::new(),
                    });
                    Ok(session)
                })
            })
        };
        Some(listener.wakes(&what, opener, parse_kind_delay))
    }
}

/// A watch on the wake keys: each put, as `<kind> <ms>`, until the watch ends.
struct Session {
    stream: WatchStream,
    keys: Keys,
    /// The payloads of a response not handed out yet.
    pending: VecDeque<String>,
}

#[async_trait::async_trait]
impl WakeSession for Session {
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(payload) = self.pending.pop_front() {
                return Some(payload);
            }
            let response = self.stream.message().await.ok()??;
            if response.canceled() {
                return None; // compacted, or refused: open another
            }
            for event in response.events() {
                if event.event_type() != EventType::Put {
                    continue;
                }
                let Some(kv) = event.kv() else { continue };
                // A key or value that does not read wakes every kind (an empty payload).
                let payload = match (self.keys.kind_of_wake(kv.key()), kv.value_str()) {
                    (Some(kind), Ok(ms)) => format!("{kind} {ms}"),
                    _ => String::new(),
                };
                self.pending.push_back(payload);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn wake_keys_name_their_kind() {
        let keys = Keys::new("ns");
        assert_eq!(
            keys.kind_of_wake(&keys.wake("send mail")),
            Some("send mail")
        );
        let (kind, delay) = parse_kind_delay("send mail 250").unwrap();
        assert_eq!(
            (kind.as_str(), delay),
            ("send mail", Duration::from_millis(250))
        );
        for bad in ["", "0", "kind x", "nospace", " 5"] {
            assert_eq!(parse_kind_delay(bad), None, "{bad:?}");
        }
    }
}
