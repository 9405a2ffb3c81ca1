//! Signals on Redis: [`LeaseStore::deliver_signal`](lease_core::LeaseStore::deliver_signal)
//! (`lua/signal.lua`), and the reading of a run's wait and of how its last wait ended, as the
//! scripts keep them (`lua/record.lua`).

use lease_core::{
    Error, Fence, Result, RunId, Signal, SignalName, SignalRefusal, Signalled, StoreTime, Wait,
    WaitEnd,
};

use crate::call::Call;
use crate::keys::{self, Class};
use crate::store::{RedisLeaseStore, SCRIPTS};

impl RedisLeaseStore {
    /// Delivers `payload` to the wait of `fence` for `name` on `run`, by
    /// [`signal_verdict`](lease_core::signal::signal_verdict)'s rule, in one script; a
    /// delivery, and a duplicate of one (which a retry takes for its own), are confirmed by the
    /// replicas before they are reported, as an end is.
    pub(crate) async fn deliver(
        &self,
        run: &RunId,
        name: &SignalName,
        fence: Fence,
        payload: &[u8],
    ) -> Result<Signalled> {
        lease_core::signal::check_signal_payload(payload)?;
        let encoded = keys::encode(run.as_str());
        let (reply, ack, _) = self
            .write_kinded("signal", &Class::default(), |kind| {
                let mut call = Call::new(&SCRIPTS.signal);
                call.key(self.keys.runs())
                    .key(self.keys.claimable_of(kind))
                    .key(self.keys.waits())
                    .key(self.keys.deadlines())
                    .key(self.keys.resumed())
                    .key(self.keys.suspended())
                    .key(self.keys.attempts())
                    .key(self.keys.kinds())
                    .arg(&encoded)
                    .arg(name.as_str())
                    .arg(fence.get())
                    .arg(payload)
                    .arg(kind.arg());
                call
            })
            .await?;
        match reply.status()? {
            status @ ("ok" | "duplicate" | "early") => {
                ack.confirm()?;
                Ok(Signalled::new(run.clone(), status == "duplicate"))
            }
            "none" => Err(Error::NotFound { run: run.clone() }),
            "refused" => {
                let reason = reply.str(2)?;
                Err(Error::StaleSignal {
                    run: run.clone(),
                    state: reply.state(1)?,
                    reason: SignalRefusal::parse(reason)
                        .ok_or_else(|| reply.bad(format!("unknown refusal {reason:?}")))?,
                })
            }
            other => Err(reply.bad(format!("unknown status {other:?}")).into()),
        }
    }
}

/// A wait as the wait hash keeps it: `fence:deadline:name`, the deadline in µs or empty.
pub(crate) fn parse_wait(text: &str) -> Option<Wait> {
    let mut parts = text.splitn(3, ':');
    let fence = Fence::new(parts.next()?.parse().ok()?).ok()?;
    let deadline = match parts.next()? {
        "" => None,
        us => Some(StoreTime::from_micros(us.parse().ok()?)),
    };
    let name = SignalName::new(parts.next()?).ok()?;
    Some(Wait::new(name, deadline, fence))
}

/// How a wait ended, as the resumed hash keeps it: `S:fence:at:name`, byte 31 and the
/// payload (its bytes, exactly), or `T:fence:deadline:name`.
pub(crate) fn parse_resumed(bytes: &[u8]) -> Option<WaitEnd> {
    let mut parts = bytes.splitn(4, |b| *b == b':');
    let how = parts.next()?;
    let number = |b: &[u8]| -> Option<u64> { std::str::from_utf8(b).ok()?.parse().ok() };
    let fence = Fence::new(number(parts.next()?)?).ok()?;
    let at = StoreTime::from_micros(number(parts.next()?)?);
    let rest = parts.next()?;
    let text =
        |b: &[u8]| -> Option<SignalName> { SignalName::new(std::str::from_utf8(b).ok()?).ok() };
    match how {
        b"S" => {
            let split = rest.iter().position(|b| *b == 31)?;
            let name = text(&rest[..split])?;
            Some(WaitEnd::Signalled(Signal::new(
                name,
                fence,
                at,
                &rest[split + 1..],
            )))
        }
        b"T" => Some(WaitEnd::TimedOut {
            name: text(rest)?,
            fence,
            at,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_and_their_ends_read_back_exactly() {
        let wait = parse_wait("7:1700000000000000:pay:ment").unwrap();
        assert_eq!(
            (wait.fence.get(), wait.deadline, wait.name.as_str()),
            (
                7,
                Some(StoreTime::from_micros(1_700_000_000_000_000)),
                "pay:ment"
            )
        );
        assert_eq!(parse_wait("7::approval").unwrap().deadline, None);
        assert!(parse_wait("x::approval").is_none());

        let mut raw = b"S:3:42:a:b\x1f".to_vec();
        let payload = [0u8, 31, b':', 255, b'\n'];
        raw.extend_from_slice(&payload);
        let Some(WaitEnd::Signalled(signal)) = parse_resumed(&raw) else {
            panic!("a signal");
        };
        assert_eq!(
            (signal.name.as_str(), signal.fence.get(), signal.payload()),
            ("a:b", 3, &payload[..])
        );
        assert_eq!(
            parse_resumed(b"T:3:42:approval"),
            Some(WaitEnd::TimedOut {
                name: SignalName::new("approval").unwrap(),
                fence: Fence::new(3).unwrap(),
                at: StoreTime::from_micros(42),
            })
        );
        assert!(
            parse_resumed(b"S:3:42:approval").is_none(),
            "no payload mark"
        );
        assert!(parse_resumed(b"X:3:42:approval").is_none());
    }
}
